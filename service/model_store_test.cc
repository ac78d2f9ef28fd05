// ModelStore: in-memory registry rules, persistence under data_dir, and start-up loading
// that skips corrupt, truncated and mismatching files with one log line each.
#include "service/model_store.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/model_digest.h"
#include "service/model_file.h"
#include "service/model_test_util.h"
#include "tests/testing/test_dir.h"

namespace kvtrim::service::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

/// Lines of `text` containing `fragment`.
int CountLines(const std::string& text, const std::string& fragment) {
  std::istringstream in(text);
  int count = 0;
  for (std::string line; std::getline(in, line);) count += line.find(fragment) != std::string::npos;
  return count;
}

ModelInput ModelA() {
  ModelInput input = MakeTestModelInput(2, 4, 2, 8, 16, 1, /*with_query_stats=*/true);
  AddTestProfile(&input, "snapkv", "snapkv", 4, 16, 2);
  return input;
}
ModelInput ModelB() { return MakeTestModelInput(3, 2, 1, 4, 8, 2, false); }
ModelInput ModelC() { return MakeTestModelInput(1, 2, 2, 4, 8, 3, false); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}
void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

class ModelStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = kvtrim::testing::MakeTestSubdir("models"); }
  void TearDown() override { fs::remove_all(dir_); }

  ModelStoreOptions Options(int max_models = 16) const {
    ModelStoreOptions options;
    options.data_dir = dir_;
    options.max_models = max_models;
    return options;
  }

  /// Registers A and B in a store on dir_; returns their digests.
  std::pair<std::string, std::string> PersistTwo() {
    std::ostringstream log;
    ModelStore store(Options(), log);
    EXPECT_EQ(*store.LoadAll(), 0);
    auto a = store.Add(ModelA());
    auto b = store.Add(ModelB());
    EXPECT_TRUE(a.ok() && b.ok());
    return {*a, *b};
  }

  std::string dir_;
};

TEST(ModelStoreMemoryTest, AddFindListDelete) {
  std::ostringstream log;
  ModelStore store(ModelStoreOptions(), log);
  EXPECT_EQ(*store.LoadAll(), 0);
  auto digest = store.Add(ModelA());
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, ComputeModelDigest(ModelA()));
  auto model = store.Find(*digest);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->digest, *digest);
  EXPECT_EQ(model->layout.num_layers, 2);
  EXPECT_TRUE(model->has_query_stats());
  ASSERT_NE(model->FindProfile("snapkv"), nullptr);
  // The same content again: same digest, nothing added.
  EXPECT_EQ(*store.Add(ModelA()), *digest);
  EXPECT_EQ(store.size(), 1u);
  EXPECT_EQ(store.List().size(), 1u);
  EXPECT_TRUE(store.Delete(*digest).ok());
  EXPECT_EQ(store.Find(*digest), nullptr);
  EXPECT_NE(model->w_o.size(), 0u);  // still usable by whoever holds it
  absl::Status again = store.Delete(*digest);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.message()), HasSubstr("digest: no model"));
  absl::Status bad = store.Delete("sha256:xyz");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("digest: 'sha256:xyz' is not"));
  EXPECT_EQ(store.Delete("").code(), absl::StatusCode::kInvalidArgument);
  // One line: where the registration's time went; nothing else.
  const std::string text = log.str();
  EXPECT_THAT(text, ::testing::StartsWith("kvtrimd: model " + *digest + " stored in "));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}

TEST(ModelStoreMemoryTest, InvalidModelIsRefusedNamingTheField) {
  std::ostringstream log;
  ModelStore store(ModelStoreOptions(), log);
  ModelInput input = ModelB();
  input.tensors["layers.1.w_o"].shape = {4, 2};  // [D=8, H_q*d=8] expected
  auto digest = store.Add(std::move(input));
  EXPECT_EQ(digest.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(digest.status().message()), HasSubstr("weights[layers.1.w_o].shape"));
  EXPECT_EQ(store.size(), 0u);
}

TEST(ModelStoreMemoryTest, MaxModels) {
  std::ostringstream log;
  ModelStoreOptions options;
  options.max_models = 2;
  ModelStore store(options, log);
  ASSERT_TRUE(store.Add(ModelA()).ok());
  ASSERT_TRUE(store.Add(ModelB()).ok());
  EXPECT_TRUE(store.Add(ModelA()).ok());  // already held: not a new model
  auto third = store.Add(ModelC());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("--max_models"));
}

TEST(ModelStoreMemoryTest, ConcurrentAddsOfTheSameModel) {
  std::ostringstream log;
  ModelStore store(ModelStoreOptions(), log);
  std::vector<std::string> digests(6);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < digests.size(); ++i) {
    threads.emplace_back([&, i] { digests[i] = store.Add(ModelA()).value_or("failed"); });
  }
  for (auto& t : threads) t.join();
  for (const auto& d : digests) EXPECT_EQ(d, digests[0]);
  EXPECT_EQ(store.size(), 1u);
}

TEST_F(ModelStoreTest, PersistsAndLoadsBack) {
  const auto [a, b] = PersistTwo();
  EXPECT_TRUE(fs::exists(dir_ + "/" + DigestHex(a) + ".kvtmodel"));
  EXPECT_TRUE(fs::exists(dir_ + "/" + DigestHex(b) + ".kvtmodel"));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().extension(), ".kvtmodel") << entry.path();
  }
  EXPECT_EQ(files, 2);

  std::ostringstream log;
  ModelStore store(Options(), log);
  auto loaded = store.LoadAll();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, 2);
  EXPECT_TRUE(log.str().empty()) << log.str();
  auto model = store.Find(a);
  ASSERT_NE(model, nullptr);
  const ModelInput original = ModelA();
  EXPECT_EQ(model->input.layout.name, original.layout.name);
  EXPECT_EQ(model->input.rope_theta, original.rope_theta);
  EXPECT_EQ(model->input.tensors.size(), original.tensors.size());
  for (const auto& [name, t] : original.tensors) {
    EXPECT_EQ(model->input.tensors.at(name).bytes, t.bytes) << name;
    EXPECT_EQ(model->input.tensors.at(name).shape, t.shape) << name;
  }
  const LukvProfile* profile = model->FindProfile("snapkv");
  ASSERT_NE(profile, nullptr);
  EXPECT_EQ(profile->metric, "snapkv");
  EXPECT_EQ(profile->sink, 4);
  EXPECT_EQ(profile->window, 16);
  ASSERT_NE(store.Find(b), nullptr);
}

TEST_F(ModelStoreTest, RegisteringAgainDoesNotRewriteTheFile) {
  std::ostringstream log;
  ModelStore store(Options(), log);
  ASSERT_TRUE(store.LoadAll().ok());
  const std::string digest = *store.Add(ModelA());
  struct stat before {}, after {};
  ASSERT_EQ(stat(store.PathFor(digest).c_str(), &before), 0);
  ASSERT_EQ(*store.Add(ModelA()), digest);
  ASSERT_EQ(stat(store.PathFor(digest).c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // an atomic rewrite would be a new inode
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
}

// The file is written beside the build: a model the build refuses is not left on disk, and
// the data dir holds only the valid one.
TEST_F(ModelStoreTest, AnInvalidModelLeavesNoFile) {
  std::ostringstream log;
  ModelStore store(Options(), log);
  ASSERT_TRUE(store.LoadAll().ok());
  ModelInput input = ModelB();
  input.tensors["layers.1.w_o"].shape = {4, 2};
  auto refused = store.Add(std::move(input));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.size(), 0u);
  const std::string digest = *store.Add(ModelA());
  EXPECT_THAT(log.str(), HasSubstr("(beside the digest)"));
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir_)) files.push_back(entry.path().string());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], store.PathFor(digest));
}

TEST_F(ModelStoreTest, DeleteRemovesTheFile) {
  const auto [a, b] = PersistTwo();
  std::ostringstream log;
  ModelStore store(Options(), log);
  ASSERT_EQ(*store.LoadAll(), 2);
  ASSERT_TRUE(store.Delete(a).ok());
  EXPECT_FALSE(fs::exists(store.PathFor(a)));
  EXPECT_TRUE(fs::exists(store.PathFor(b)));
  ModelStore reloaded(Options(), log);
  EXPECT_EQ(*reloaded.LoadAll(), 1);
  EXPECT_EQ(reloaded.Find(a), nullptr);
}

TEST_F(ModelStoreTest, AModelAnotherReplicaWroteLoadsOnItsFirstUse) {
  std::ostringstream log_a, log_b;
  ModelStore replica_a(Options(), log_a);
  ModelStore replica_b(Options(), log_b);  // shares dir_, started before the registration
  ASSERT_EQ(*replica_a.LoadAll(), 0);
  ASSERT_EQ(*replica_b.LoadAll(), 0);
  const auto a = replica_a.Add(ModelA());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(replica_b.Find(*a), nullptr);  // Find never reads the volume
  // Four requests for it at once: it is read once, and all get the same model.
  std::vector<std::shared_ptr<const RegisteredModel>> found(4);
  std::vector<std::thread> threads;
  for (auto& model : found) {
    threads.emplace_back([&replica_b, &model, &a] { model = replica_b.FindOrLoad(*a); });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_NE(found[0], nullptr);
  for (const auto& model : found) EXPECT_EQ(model, found[0]);
  EXPECT_EQ(found[0]->digest, *a);
  EXPECT_EQ(replica_b.Find(*a), found[0]);
  EXPECT_EQ(replica_b.size(), 1u);
  EXPECT_EQ(CountLines(log_b.str(), "kvtrimd: model " + *a + " loaded from "), 1) << log_b.str();
  // Not on the volume, malformed, or an in-memory store: nothing is read.
  const std::string unknown = "sha256:" + std::string(64, 'e');
  EXPECT_EQ(replica_b.FindOrLoad(unknown), nullptr);
  EXPECT_EQ(replica_b.FindOrLoad("sha256:../../etc/passwd"), nullptr);
  ModelStore memory_only(ModelStoreOptions{}, log_b);
  EXPECT_EQ(memory_only.FindOrLoad(*a), nullptr);
}

TEST_F(ModelStoreTest, LoadingOnFirstUseRespectsMaxModelsAndSkipsCorruptFiles) {
  const auto [a, b] = PersistTwo();
  std::ostringstream log;
  ModelStore full(Options(/*max_models=*/1), log);
  ASSERT_TRUE(full.Add(ModelC()).ok());  // LoadAll not called: dir_'s A and B are unread
  EXPECT_EQ(full.FindOrLoad(a), nullptr);
  EXPECT_THAT(log.str(), HasSubstr("not loading model file"));
  const std::string path = dir_ + "/" + DigestHex(b) + ".kvtmodel";
  std::string bytes = ReadFile(path);
  bytes[bytes.size() - 3] ^= 0x40;
  WriteFile(path, bytes);
  std::ostringstream corrupt_log;
  ModelStore store(Options(), corrupt_log);
  EXPECT_EQ(store.FindOrLoad(b), nullptr);
  EXPECT_EQ(CountLines(corrupt_log.str(), "kvtrimd: skipping model file " + path + ": "), 1)
      << corrupt_log.str();
  EXPECT_NE(store.FindOrLoad(a), nullptr);
}

TEST_F(ModelStoreTest, CorruptFileIsSkippedWithOneLineAndOthersLoad) {
  const auto [a, b] = PersistTwo();
  const std::string path = dir_ + "/" + DigestHex(a) + ".kvtmodel";
  std::string bytes = ReadFile(path);
  bytes[bytes.size() - 3] ^= 0x40;  // one bit of the last tensor's data
  WriteFile(path, bytes);

  std::ostringstream log;
  ModelStore store(Options(), log);
  EXPECT_EQ(*store.LoadAll(), 1);
  EXPECT_EQ(store.Find(a), nullptr);
  EXPECT_NE(store.Find(b), nullptr);
  EXPECT_EQ(CountLines(log.str(), "kvtrimd: skipping model file " + path + ": "), 1)
      << log.str();
  EXPECT_THAT(log.str(), HasSubstr("the file is corrupt"));
  EXPECT_EQ(CountLines(log.str(), "kvtrimd:"), 1) << log.str();
}

TEST_F(ModelStoreTest, OversizeAndNonRegularFilesAreSkippedWithoutReadingThem) {
  const auto [a, b] = PersistTwo();
  // A sparse 1 GiB file under a well-formed name (never allocated: it is above the limit)
  // and a FIFO (opened without blocking, refused as not a regular file).
  const std::string big = dir_ + "/" + std::string(64, 'a') + ".kvtmodel";
  {
    std::ofstream out(big, std::ios::binary);
    out.seekp((int64_t{1} << 30) - 1);
    out.put('\0');
  }
  const std::string fifo = dir_ + "/" + std::string(64, 'b') + ".kvtmodel";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::ostringstream log;
  ModelStoreOptions options = Options();
  options.max_model_bytes = 1 << 20;
  ModelStore store(options, log);
  EXPECT_EQ(*store.LoadAll(), 2);
  EXPECT_NE(store.Find(a), nullptr);
  EXPECT_NE(store.Find(b), nullptr);
  EXPECT_THAT(log.str(), HasSubstr("skipping model file " + big +
                                   ": the file has 1073741824 bytes, more than a model may "
                                   "(17825792 bytes"));
  EXPECT_THAT(log.str(), HasSubstr("skipping model file " + fifo + ": not a regular file"));
}

TEST_F(ModelStoreTest, AStoredNameAboveTheLimitIsSkipped) {
  ModelInput input = ModelB();
  input.layout.name = std::string(5000, 'n');
  const std::string path = dir_ + "/" + std::string(64, 'c') + ".kvtmodel";
  ASSERT_TRUE(WriteModelFile(path, input, "sha256:" + std::string(64, 'c')).ok());
  std::ostringstream log;
  ModelStore store(Options(), log);
  EXPECT_EQ(*store.LoadAll(), 0);
  EXPECT_THAT(log.str(), HasSubstr("skipping model file " + path +
                                   ": __metadata__.name has 5000 bytes, more than 256"));
}

TEST_F(ModelStoreTest, TruncatedFileIsSkipped) {
  const auto [a, b] = PersistTwo();
  const std::string path = dir_ + "/" + DigestHex(b) + ".kvtmodel";
  for (size_t keep : {size_t{0}, size_t{5}, size_t{200}, ReadFile(path).size() - 1}) {
    SCOPED_TRACE(keep);
    const std::string full = ReadFile(path);
    WriteFile(path, full.substr(0, keep));
    std::ostringstream log;
    ModelStore store(Options(), log);
    EXPECT_EQ(*store.LoadAll(), 1);
    EXPECT_NE(store.Find(a), nullptr);
    EXPECT_EQ(store.Find(b), nullptr);
    EXPECT_EQ(CountLines(log.str(), "kvtrimd: skipping model file " + path + ": "), 1)
        << log.str();
    WriteFile(path, full);
  }
}

TEST_F(ModelStoreTest, FileUnderAnotherDigestIsSkipped) {
  const auto [a, b] = PersistTwo();
  const std::string other = dir_ + "/" + std::string(64, 'c') + ".kvtmodel";
  fs::copy_file(dir_ + "/" + DigestHex(a) + ".kvtmodel", other);
  WriteFile(dir_ + "/notes.kvtmodel", "hello");
  WriteFile(dir_ + "/README", "ignored: not a model file name");
  std::ostringstream log;
  ModelStore store(Options(), log);
  EXPECT_EQ(*store.LoadAll(), 2);
  EXPECT_EQ(CountLines(log.str(), "kvtrimd: skipping model file " + other +
                                      ": the digest it stores"),
            1)
      << log.str();
  EXPECT_EQ(CountLines(log.str(), "notes.kvtmodel: the file name is not"), 1) << log.str();
  EXPECT_EQ(CountLines(log.str(), "README"), 0);
}

TEST_F(ModelStoreTest, StoredDigestMismatchingTheContentIsSkipped) {
  // A well-formed file whose metadata claims a digest its content does not hash to.
  ModelInput input = ModelC();
  const std::string claimed = std::string(kDigestPrefix) + std::string(64, 'e');
  ASSERT_TRUE(WriteModelFile(dir_ + "/" + std::string(64, 'e') + ".kvtmodel", input, claimed).ok());
  std::ostringstream log;
  ModelStore store(Options(), log);
  EXPECT_EQ(*store.LoadAll(), 0);
  EXPECT_THAT(log.str(), HasSubstr("its content hashes to " + ComputeModelDigest(input)));
}

TEST_F(ModelStoreTest, AFileOfAnEarlierServerIsMigratedToItsV2Digest) {
  // A file persisted before v2: named and stamped with the v1 digest of its content.
  const ModelInput input = ModelA();
  const std::string legacy = ComputeLegacyModelDigest(input);
  const std::string digest = ComputeModelDigest(input);
  ASSERT_NE(legacy, digest);
  const std::string old_path = dir_ + "/" + DigestHex(legacy) + ".kvtmodel";
  ASSERT_TRUE(WriteModelFile(old_path, input, legacy).ok());
  {
    std::ostringstream log;
    ModelStore store(Options(), log);
    EXPECT_EQ(*store.LoadAll(), 1);
    ASSERT_NE(store.Find(digest), nullptr) << log.str();
    EXPECT_EQ(store.Find(legacy), nullptr);
    EXPECT_EQ(CountLines(log.str(), "had a v1 digest; now " + store.PathFor(digest)), 1)
        << log.str();
    EXPECT_FALSE(fs::exists(old_path));
    EXPECT_TRUE(fs::exists(store.PathFor(digest)));
    // Registering the same content again finds it.
    EXPECT_EQ(*store.Add(ModelA()), digest);
  }
  std::ostringstream log;
  ModelStore store(Options(), log);
  EXPECT_EQ(*store.LoadAll(), 1);
  EXPECT_NE(store.Find(digest), nullptr);
  EXPECT_EQ(CountLines(log.str(), "v1 digest"), 0) << log.str();
}

TEST_F(ModelStoreTest, LeftoverTemporaryFilesAreRemoved) {
  const auto [a, b] = PersistTwo();
  const std::string tmp = dir_ + "/" + DigestHex(a) + ".kvtmodel.tmp";
  WriteFile(tmp, "half a model");
  std::ostringstream log;
  ModelStore store(Options(), log);
  EXPECT_EQ(*store.LoadAll(), 2);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_THAT(log.str(), HasSubstr("removed unfinished model file " + tmp));
}

TEST_F(ModelStoreTest, MissingDataDirIsCreated) {
  ModelStoreOptions options = Options();
  options.data_dir = dir_ + "/a/b";
  std::ostringstream log;
  ModelStore store(options, log);
  EXPECT_EQ(*store.LoadAll(), 0);
  EXPECT_TRUE(fs::is_directory(options.data_dir));
  ASSERT_TRUE(store.Add(ModelB()).ok());
}

TEST_F(ModelStoreTest, UnusableDataDirFailsLoad) {
  WriteFile(dir_ + "/file", "x");
  ModelStoreOptions options = Options();
  options.data_dir = dir_ + "/file/sub";
  std::ostringstream log;
  ModelStore store(options, log);
  auto loaded = store.LoadAll();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("--data_dir"));
}

}  // namespace
}  // namespace kvtrim::service::testing
