// Helpers of the transport tests: shared-memory segments, Regions leases and sessions that
// carry a client id. Test-only.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "service/test_util.h"

namespace kvtrim::service::testing {

/// A POSIX shared-memory segment created by the test (the worker's side), unlinked at
/// destruction.
class TestSegment {
 public:
  explicit TestSegment(size_t bytes) : bytes_(bytes) {
    static std::atomic<int> counter{0};
    name_ = "/kvtrim-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    fd_ = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0) << "shm_open " << name_;
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(data_, MAP_FAILED);
  }
  ~TestSegment() {
    if (data_ != MAP_FAILED) munmap(data_, bytes_);
    if (fd_ >= 0) close(fd_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  char* data() { return data_; }
  size_t size() const { return bytes_; }
  /// Shrinks the segment behind the server's back.
  void Truncate(size_t bytes) {
    munmap(data_, bytes_);
    data_ = static_cast<char*>(MAP_FAILED);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
  }

 private:
  std::string name_;
  size_t bytes_;
  int fd_ = -1;
  char* data_ = static_cast<char*>(MAP_FAILED);
};

/// One open Regions stream (a client lease).
class TestLease {
 public:
  explicit TestLease(v1::Kvtrim::Stub& stub) {
    stream_ = stub.Regions(&context_);
    v1::RegionResponse first;
    if (stream_->Read(&first) && first.has_lease()) client_id_ = first.lease().client_id();
  }
  ~TestLease() { Close(); }
  /// Ends the lease like a disconnecting client (cancels the stream).
  void Cancel() {
    if (closed_) return;
    closed_ = true;
    context_.TryCancel();
    stream_->Finish();
  }
  /// Ends the lease normally (half-close); returns the stream status.
  grpc::Status Close() {
    if (closed_) return grpc::Status::OK;
    closed_ = true;
    stream_->WritesDone();
    v1::RegionResponse ignored;
    while (stream_->Read(&ignored)) {
    }
    return stream_->Finish();
  }
  /// The stream's status when the server refused the lease (no client id was sent).
  grpc::Status RefusedStatus() {
    closed_ = true;
    return stream_->Finish();
  }
  const std::string& client_id() const { return client_id_; }

  /// Sends one request; returns the answer (code and message or the region id).
  v1::RegionResponse Send(v1::RegionRequest request) {
    request.set_tag(++tag_);
    v1::RegionResponse response;
    EXPECT_TRUE(stream_->Write(request));
    EXPECT_TRUE(stream_->Read(&response));
    EXPECT_EQ(response.tag(), tag_);
    return response;
  }
  v1::RegionResponse RegisterShm(const std::string& name, uint64_t size) {
    v1::RegionRequest r;
    r.mutable_register_region()->mutable_host_shm()->set_name(name);
    r.mutable_register_region()->mutable_host_shm()->set_size_bytes(size);
    return Send(r);
  }
  v1::RegionResponse Unregister(const std::string& id) {
    v1::RegionRequest r;
    r.mutable_unregister_region()->set_region_id(id);
    return Send(r);
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::RegionRequest, v1::RegionResponse>> stream_;
  std::string client_id_;
  uint64_t tag_ = 0;
  bool closed_ = false;
};

/// A region tensor: `slice` of region `id` for a tensor of `shape` and `dtype`.
inline v1::Tensor RegionTensor(bool device, v1::DType dtype, const std::vector<int64_t>& shape,
                               const std::string& id, uint64_t offset,
                               const std::vector<int64_t>& strides = {}) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t s : shape) t.add_shape(s);
  v1::RegionSlice* slice = device ? t.mutable_cuda_ipc() : t.mutable_host_shm();
  slice->set_region_id(id);
  slice->set_offset_bytes(offset);
  for (int64_t s : strides) slice->add_strides_elements(s);
  return t;
}

/// Runs a whole session (`messages` after begin) with the client id metadata; returns the
/// status and fills `layers` with the answers.
inline grpc::Status RunSession(v1::Kvtrim::Stub& stub, const std::string& client_id,
                               const v1::CompressionSettings& settings,
                               const std::vector<v1::SessionRequest>& messages,
                               std::vector<v1::LayerResult>* layers) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!client_id.empty()) context.AddMetadata("kvtrim-client-id", client_id);
  auto stream = stub.CompressSession(&context);
  stream->Write(SessionBegin(settings));
  for (const auto& m : messages) {
    if (!stream->Write(m)) break;
  }
  stream->WritesDone();
  v1::SessionResponse response;
  while (stream->Read(&response)) {
    if (response.has_layer() && layers != nullptr) layers->push_back(response.layer());
  }
  return stream->Finish();
}

/// Compress with the client id metadata.
inline grpc::Status CompressAs(v1::Kvtrim::Stub& stub, const std::string& client_id,
                               const v1::CompressRequest& request,
                               v1::CompressResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!client_id.empty()) context.AddMetadata("kvtrim-client-id", client_id);
  return stub.Compress(&context, request, response);
}

}  // namespace kvtrim::service::testing
