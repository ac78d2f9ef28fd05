// Tests of the CPU scorer table (cpu_scorer_table.h): registration and lookup, and that the
// table and the registry agree on the table scorers (ScorerKind::kTable).
#include "kernels/cpu/cpu_scorer_table.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "kernels/registry.h"

namespace kvtrim {
namespace {

absl::Status WriteZeros(const CpuLayer& layer, const ResolvedParams&, ThreadPool&, float* s) {
  for (int64_t i = 0; i < layer.shape.num_kv_heads * layer.shape.num_tokens; ++i) s[i] = 0;
  return absl::OkStatus();
}

TEST(CpuScorerTable, AddsFindsAndRefusesDuplicatesOrMissingExact) {
  CpuScorerTable table;
  EXPECT_TRUE(table.Add("zeros", {&WriteZeros, nullptr}));
  EXPECT_FALSE(table.Add("zeros", {&WriteZeros, &WriteZeros}));  // the name is taken
  EXPECT_FALSE(table.Add("no_exact", {nullptr, &WriteZeros}));
  ASSERT_NE(table.Find("zeros"), nullptr);
  EXPECT_EQ(table.Find("zeros")->exact, &WriteZeros);
  EXPECT_EQ(table.Find("zeros")->fast, nullptr);  // the first registration stands
  EXPECT_EQ(table.Find("no_exact"), nullptr);
  EXPECT_EQ(table.Find("zero"), nullptr);
  EXPECT_EQ(table.Names(), std::vector<std::string>{"zeros"});
}

TEST(CpuScorerTableDeathTest, RegisteringANameTwiceAbortsWithTheName) {
  CpuScorerTable table;
  table.Register("zeros", {&WriteZeros, nullptr});
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // other tests may have left threads
  EXPECT_DEATH(table.Register("zeros", {&WriteZeros, nullptr}), "CPU scorer 'zeros'");
}

TEST(CpuScorerTable, EveryTableScorerOfTheRegistryIsHereAndNothingElse) {
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  std::set<std::string> table_scorers;
  for (const ScorerSpec* spec : registry.scorers()) {
    if (spec->kind != ScorerKind::kTable) continue;
    table_scorers.insert(spec->name);
    const CpuScorer* cpu = CpuScorerTable::Builtin().Find(spec->name);
    ASSERT_NE(cpu, nullptr) << spec->name << ": no file in kernels/cpu/scorers/ registers it";
    EXPECT_NE(cpu->exact, nullptr) << spec->name;
    // The rows' outputs come from a fast scorer (CpuBackend calls it in fast numerics only).
    if (cpu->fast_with_rows != nullptr) EXPECT_NE(cpu->fast, nullptr) << spec->name;
  }
  // The window-attention scorers are table scorers too (kernels/cpu/scorers/snapkv.cc, ...).
  EXPECT_GE(table_scorers.size(), 8u);
  for (const std::string& name : CpuScorerTable::Builtin().Names()) {
    EXPECT_EQ(table_scorers.count(name), 1u)
        << name << ": registered on the CPU but not a table scorer of the registry";
  }
}

}  // namespace
}  // namespace kvtrim
