#include "service/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "service/bearer_tokens.h"

namespace kvtrim::service {

namespace {

/// 128 random bits as 32 lower-case hex digits.
std::string RandomHex() {
  static std::mutex mutex;
  static std::mt19937_64 engine{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  return absl::StrFormat("%016x%016x", engine(), engine());
}

/// The shm_open name rule: "/" then 1..250 of [A-Za-z0-9._-].
bool ValidShmName(const std::string& name) {
  if (name.size() < 2 || name.size() > 251 || name[0] != '/') return false;
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return name != "/." && name != "/..";
}

}  // namespace

const char* RegionKindName(RegionKind kind) {
  switch (kind) {
    case RegionKind::kHostShm: return "host_shm";
    case RegionKind::kCudaIpc: return "cuda_ipc";
    case RegionKind::kCudaIpcEvent: return "cuda_ipc_event";
  }
  return "unknown";
}

Region::~Region() {
  if (pinned_ != nullptr) {
    pinned_.reset();
    pinned_total_->fetch_sub(size_);
  }
  if (fd_ >= 0) close(fd_);
  if (write_fd_ >= 0) close(write_fd_);
}

absl::Status Region::WriteHost(uint64_t offset, const void* src, size_t bytes,
                               const std::string& field) const {
  if (write_fd_ < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": shared-memory region '", id_, "' is not writable by kvtrimd (",
        write_error_, "); give kvtrimd's user write access to the segment to use it as an "
        "output region"));
  }
  if (offset + bytes > size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": writing ", bytes, " bytes at offset ", offset, " passes the end of region '",
        id_, "' (", size_, " bytes)"));
  }
  const auto* in = static_cast<const char*>(src);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t put =
        pwrite(write_fd_, in + done, bytes - done, static_cast<off_t>(offset + done));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      return absl::InternalError(absl::StrCat(
          field, ": writing ", bytes, " bytes at offset ", offset, " of shared-memory region '",
          id_, "' failed after ", done, " bytes (",
          put < 0 ? std::strerror(errno) : "no progress", ")"));
    }
    done += static_cast<size_t>(put);
  }
  return absl::OkStatus();
}

absl::Status Region::ReadHostRange(uint64_t offset, char* out, size_t bytes, size_t total,
                                   size_t before, const std::string& field) const {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = pread(fd_, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": reading ", total, " bytes at offset ", offset - before,
          " of shared-memory region '", id_, "' failed after ", before + done, " bytes (",
          got < 0 ? std::strerror(errno) : "the segment is shorter than registered",
          "); the segment must stay as registered until it is unregistered"));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status Region::ReadHost(uint64_t offset, void* dst, size_t bytes,
                              const std::string& field) const {
  auto* out = static_cast<char*>(dst);
  // One pread copies at a few GB/s on one core: large reads are split into contiguous
  // ranges read at once, and the first range that fails names the error.
  const size_t threads =
      std::min<size_t>({kMaxReadThreads, bytes / kParallelReadBytes,
                        std::max(1u, std::thread::hardware_concurrency())});
  if (threads <= 1) return ReadHostRange(offset, out, bytes, bytes, 0, field);
  const size_t per_range = (bytes + threads - 1) / threads;
  std::vector<absl::Status> status(threads);
  std::vector<std::thread> readers;
  auto read_range = [&](size_t r) {
    const size_t begin = std::min(bytes, r * per_range);
    const size_t len = std::min(bytes - begin, per_range);
    status[r] = ReadHostRange(offset + begin, out + begin, len, bytes, begin, field);
  };
  for (size_t r = 1; r < threads; ++r) readers.emplace_back(read_range, r);
  read_range(0);
  for (std::thread& reader : readers) reader.join();
  for (const absl::Status& st : status) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

RegionPin::RegionPin(std::shared_ptr<Region> region) : region_(std::move(region)) {
  if (region_) region_->pins_.fetch_add(1);
}

RegionPin::~RegionPin() {
  if (region_) region_->pins_.fetch_sub(1);
}

RegionPin& RegionPin::operator=(RegionPin&& other) noexcept {
  if (this != &other) {
    if (region_) region_->pins_.fetch_sub(1);
    region_ = std::move(other.region_);
  }
  return *this;
}

RegionRegistry::RegionRegistry(RegionOptions options, DeviceMapper* mapper)
    : options_(options), mapper_(mapper) {}

absl::Status RegionRegistry::CheckEnabled() const {
  if (options_.allow_client_shm) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "regions: this kvtrimd runs without --allow_client_shm, so host_shm and cuda_ipc "
      "tensors are off; send inline_data, or start kvtrimd with --allow_client_shm");
}

void RegionRegistry::PinHostShm(Region& region, const std::string& field) {
  if (mapper_ == nullptr) return;
  const uint64_t bytes = region.size_bytes();
  // Reserve the bytes first, so that concurrent registrations cannot pass the cap together.
  uint64_t total = pinned_total_->load();
  do {
    if (total + bytes > options_.max_pinned_shm_bytes || total + bytes < total) return;
  } while (!pinned_total_->compare_exchange_weak(total, total + bytes));
  auto pinned = mapper_->PinHost(region.fd_, bytes, field);
  if (!pinned.ok()) {
    pinned_total_->fetch_sub(bytes);
    std::cerr << absl::StrCat("kvtrimd: host shm region ", region.id(), " is read with pread: ",
                              pinned.status().message(), "\n");
    return;
  }
  region.pinned_ = *std::move(pinned);
  region.pinned_total_ = pinned_total_;
  std::cerr << absl::StrCat("kvtrimd: host shm region ", region.id(), ": ", bytes,
                            " bytes page-locked; its tensors are copied to the device by DMA\n");
}

std::string RegionRegistry::OpenClient(const std::string& tenant) {
  std::string id = RandomHex();
  std::lock_guard<std::mutex> lock(mutex_);
  clients_.emplace(TenantScopedId(tenant, id), 0);
  return id;
}

void RegionRegistry::CloseClient(const std::string& client_id) {
  std::vector<std::shared_ptr<Region>> released;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    clients_.erase(client_id);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->client_id() == client_id) {
        released.push_back(std::move(it->second));
        it = regions_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

absl::StatusOr<std::string> RegionRegistry::Register(const std::string& client_id,
                                                     const v1::RegisterRegion& request) {
  KVTRIM_RETURN_IF_ERROR(CheckEnabled());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = clients_.find(client_id);
    if (it == clients_.end()) {
      return absl::FailedPreconditionError("register_region: the lease has ended");
    }
    if (it->second >= options_.max_regions_per_client) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "register_region: this client already holds ", it->second,
          " regions (--max_regions_per_client); unregister some first"));
    }
  }
  std::shared_ptr<Region> region;
  switch (request.kind_case()) {
    case v1::RegisterRegion::kHostShm: {
      const v1::HostShmRegion& shm = request.host_shm();
      const std::string field = "register_region.host_shm";
      if (!ValidShmName(shm.name())) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".name: ", QuoteClientText(shm.name()),
            " is not a shm_open name: '/' then 1..250 of [A-Za-z0-9._-]"));
      }
      if (shm.size_bytes() == 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".size_bytes: must be >= 1"));
      }
      // Non-blocking: a FIFO put where a segment is expected must not block this handler
      // (it is then refused below as not a regular file).
      const int fd = shm_open(shm.name().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
      if (fd < 0) {
        const int err = errno;
        std::string text = absl::StrCat(field, ".name: cannot open shared-memory segment '",
                                        shm.name(), "': ", std::strerror(err));
        // The two deployment mistakes behind these (docs/operations.md, "Kubernetes").
        if (err == ENOENT) {
          return absl::NotFoundError(absl::StrCat(
              text, " (kvtrimd and the client must see one /dev/shm: same pod, or both mount "
                    "the node's)"));
        }
        if (err == EACCES) {
          absl::StrAppend(&text, " (segments are created 0600: run kvtrimd as the client's "
                                 "user)");
        }
        return absl::InvalidArgumentError(text);
      }
      struct stat info {};
      if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".name: '", shm.name(), "' is not a shared-memory segment (a regular file)"));
      }
      if (static_cast<uint64_t>(info.st_size) < shm.size_bytes()) {
        close(fd);
        return absl::InvalidArgumentError(absl::StrCat(field, ".size_bytes: ", shm.size_bytes(),
                                                       " exceeds the segment's ", info.st_size,
                                                       " bytes"));
      }
      region = std::make_shared<Region>(RegionKind::kHostShm, "shm-" + RandomHex(), client_id,
                                        shm.size_bytes());
      region->fd_ = fd;
      PinHostShm(*region, field);
      // Output regions are written through a second descriptor, when the segment allows it.
      region->write_fd_ = shm_open(shm.name().c_str(), O_RDWR | O_CLOEXEC, 0);
      if (region->write_fd_ < 0) region->write_error_ = std::strerror(errno);
      break;
    }
    case v1::RegisterRegion::kCudaIpc:
    case v1::RegisterRegion::kCudaIpcEvent: {
      const bool is_event = request.kind_case() == v1::RegisterRegion::kCudaIpcEvent;
      const std::string field =
          is_event ? "register_region.cuda_ipc_event" : "register_region.cuda_ipc";
      if (mapper_ == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": this kvtrimd computes on the CPU (no GPU backend), so it cannot map CUDA "
            "IPC memory; use host_shm or inline_data"));
      }
      const std::string& uuid =
          is_event ? request.cuda_ipc_event().device_uuid() : request.cuda_ipc().device_uuid();
      if (uuid.size() != 16) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".device_uuid: ", uuid.size(), " bytes; send the 16-byte cudaDeviceProp.uuid"));
      }
      DeviceMapper* mapper = mapper_->ForUuid(uuid);
      if (mapper == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ".device_uuid: the memory is on device ", mapper_->FormatUuid(uuid),
            is_event ? "" : absl::StrCat(" (the worker's ordinal ", request.cuda_ipc().device(), ")"),
            " but this kvtrimd computes on ", mapper_->ServedDevices(),
            "; register with the kvtrimd of that GPU"));
      }
      if (is_event) {
        auto event = mapper->OpenEvent(request.cuda_ipc_event().handle(), field);
        if (!event.ok()) return event.status();
        region = std::make_shared<Region>(RegionKind::kCudaIpcEvent, "evt-" + RandomHex(),
                                          client_id, 0);
        region->event_ = *std::move(event);
      } else {
        auto memory =
            mapper->OpenMemory(request.cuda_ipc().handle(), request.cuda_ipc().size_bytes(), field);
        if (!memory.ok()) return memory.status();
        region = std::make_shared<Region>(RegionKind::kCudaIpc, "ipc-" + RandomHex(), client_id,
                                          request.cuda_ipc().size_bytes());
        region->memory_ = *std::move(memory);
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          "register_region: empty; set host_shm, cuda_ipc or cuda_ipc_event");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::FailedPreconditionError("register_region: the lease has ended");
  }
  ++it->second;
  const std::string id = region->id();
  regions_.emplace(id, std::move(region));
  return id;
}

absl::Status RegionRegistry::Unregister(const std::string& client_id,
                                        const std::string& region_id) {
  std::shared_ptr<Region> released;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(region_id);
  if (it == regions_.end() || it->second->client_id() != client_id) {
    return absl::NotFoundError(absl::StrCat("unregister_region.region_id: this client holds no "
                                            "region ", QuoteClientText(region_id)));
  }
  if (const int pins = it->second->pins(); pins > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unregister_region.region_id: region '", region_id, "' is being read by ", pins,
        " running layer(s); unregister it after their answers"));
  }
  released = std::move(it->second);
  regions_.erase(it);
  auto client = clients_.find(client_id);
  if (client != clients_.end()) --client->second;
  return absl::OkStatus();
}

absl::StatusOr<RegionPin> RegionRegistry::Acquire(const std::string& client_id,
                                                  const std::string& region_id, RegionKind kind,
                                                  const std::string& field) const {
  if (auto st = CheckEnabled(); !st.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(field, ": ", st.message()));
  }
  if (client_id.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": the call carries no '", kClientIdMetadata, "' metadata; send the client id "
        "of the Regions lease that registered the region"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat(field, ": no region ", QuoteClientText(region_id),
                                            " (never registered, unregistered, or its lease "
                                            "ended)"));
  }
  const Region& region = *it->second;
  if (region.client_id() != client_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, ": region '", region_id, "' belongs to another client; a call may use only the "
        "regions of its own kvtrim-client-id"));
  }
  if (region.kind() != kind) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": region '", region_id, "' is a ",
                                                   RegionKindName(region.kind()),
                                                   " region, not ", RegionKindName(kind)));
  }
  return RegionPin(it->second);
}

absl::StatusOr<std::vector<std::shared_ptr<const Region>>> RegionRegistry::ClientRegions(
    const std::string& client_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (clients_.find(client_id) == clients_.end()) {
    return absl::NotFoundError(absl::StrCat(
        kClientIdMetadata, ": no open lease has this id (its Regions stream ended, or kvtrimd "
        "restarted); open a new lease and register the memory again"));
  }
  std::vector<std::shared_ptr<const Region>> held;
  for (const auto& [id, region] : regions_) {
    if (region->client_id() == client_id) held.push_back(region);
  }
  return held;
}

std::map<RegionKind, int64_t> RegionRegistry::CountByKind() const {
  std::map<RegionKind, int64_t> counts = {
      {RegionKind::kHostShm, 0}, {RegionKind::kCudaIpc, 0}, {RegionKind::kCudaIpcEvent, 0}};
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, region] : regions_) ++counts[region->kind()];
  return counts;
}

int64_t RegionRegistry::clients() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(clients_.size());
}

}  // namespace kvtrim::service
