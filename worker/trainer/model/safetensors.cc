#include "worker/trainer/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/status_guard.h"

namespace trainctl::model {
namespace internal {

// A whole file mapped copy-on-write; unmapped when the last tensor view into it is gone.
class MappedFile {
 public:
  MappedFile(void* base, size_t size) : base_(base), size_(size) {}
  ~MappedFile() {
    if (base_ != nullptr) munmap(base_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return static_cast<const char*>(base_); }
  size_t size() const { return size_; }

 private:
  void* base_;
  size_t size_;
};

}  // namespace internal

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

// The torch type of each dtype safetensors_header.h accepts (element sizes live there).
struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
};
constexpr DtypeEntry kDtypes[] = {
    {"F64", torch::kFloat64},   {"F32", torch::kFloat32}, {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
    {"I16", torch::kInt16},     {"I8", torch::kInt8},     {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},
};

const DtypeEntry* DtypeByName(const std::string& name) {
  for (const DtypeEntry& e : kDtypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

bool LittleEndianHost() {
  const uint16_t probe = 1;
  unsigned char first = 0;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("writing ", path, ": ", std::strerror(errno)));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Moves `tensor` to a contiguous CPU tensor, the form its bytes are written in.
torch::Tensor HostContiguous(const torch::Tensor& tensor) {
  return tensor.detach().to(torch::kCPU).contiguous();
}

}  // namespace

absl::StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.type == dtype) return std::string(e.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors has no dtype for ", c10::toString(dtype)));
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  if (!LittleEndianHost()) {
    return absl::UnimplementedError("safetensors reading needs a little-endian host");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", file_size,
                                            " bytes, too short for a safetensors header"));
  }
  // Private and writable: pages written through a tensor view are copied, the file never changes.
  void* base = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(map_errno)));
  }
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = std::make_shared<internal::MappedFile>(base, file_size);
  const char* bytes = file->mapping_->data();
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(bytes, file_size, path));
  file->tensors_ = std::move(header.tensors);
  file->metadata_ = std::move(header.metadata);
  file->data_ = bytes + header.data_offset;
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const SafetensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<torch::Tensor> SafetensorsFile::Get(const std::string& name,
                                                   std::optional<torch::ScalarType> dtype) const {
  const SafetensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor ", name, " not found in ", path_));
  }
  const DtypeEntry* stored = DtypeByName(info->dtype);  // validated at Open
  const char* ptr = data_ + info->begin;
  const auto options = torch::TensorOptions().dtype(stored->type);
  torch::Tensor tensor;
  if (reinterpret_cast<uintptr_t>(ptr) % SafetensorsDtypeBytes(info->dtype) == 0) {
    std::shared_ptr<internal::MappedFile> keep = mapping_;
    tensor = torch::from_blob(
        const_cast<char*>(ptr), info->shape, [keep](void*) mutable { keep.reset(); }, options);
  } else {
    tensor = torch::empty(info->shape, options);
    std::memcpy(tensor.data_ptr(), ptr, info->end - info->begin);
  }
  if (dtype.has_value() && *dtype != stored->type) {
    RETURN_IF_ERROR(Guarded(
        absl::StrCat("tensor ", name, " in ", path_, ": cannot convert ", info->dtype, " to ",
                     c10::toString(*dtype)),
        [&] { tensor = tensor.to(*dtype); }, absl::StatusCode::kInvalidArgument));
  }
  return tensor;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsCheckpoint

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& path) {
  std::error_code ec;
  std::string target = path;
  if (fs::is_directory(path, ec)) {
    const fs::path single = fs::path(path) / kSingleName;
    const fs::path index = fs::path(path) / kIndexName;
    if (fs::is_regular_file(single, ec)) {
      target = single.string();
    } else if (fs::is_regular_file(index, ec)) {
      target = index.string();
    } else {
      return absl::NotFoundError(
          absl::StrCat("no ", kSingleName, " or ", kIndexName, " in ", path));
    }
  }
  auto ckpt = std::unique_ptr<SafetensorsCheckpoint>(new SafetensorsCheckpoint());
  ckpt->path_ = target;

  const bool is_index =
      target.size() >= 11 && target.compare(target.size() - 11, 11, ".index.json") == 0;
  if (!is_index) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(target));
    for (const std::string& name : file->names()) ckpt->owner_[name] = 0;
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }

  std::ifstream in(target, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", target));
  std::stringstream text;
  text << in.rdbuf();
  json index = json::parse(text.str(), nullptr, false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return absl::DataLossError(
        absl::StrCat(target, ": corrupt index: expected an object with a \"weight_map\" object"));
  }
  const fs::path dir = fs::path(target).parent_path();
  std::map<std::string, size_t> file_slot;
  for (const auto& [name, value] : index["weight_map"].items()) {
    if (!value.is_string()) {
      return absl::DataLossError(
          absl::StrCat(target, ": corrupt index: weight_map.", name, " is not a file name"));
    }
    const std::string shard = value.get<std::string>();
    if (shard.find('/') != std::string::npos || shard == ".." || shard.empty()) {
      return absl::DataLossError(
          absl::StrCat(target, ": corrupt index: weight_map.", name, " names \"", shard, "\""));
    }
    auto it = file_slot.find(shard);
    if (it == file_slot.end()) {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                       SafetensorsFile::Open((dir / shard).string()));
      it = file_slot.emplace(shard, ckpt->files_.size()).first;
      ckpt->files_.push_back(std::move(file));
    }
    const SafetensorsFile& file = *ckpt->files_[it->second];
    if (file.Find(name) == nullptr) {
      return absl::DataLossError(absl::StrCat("tensor ", name, " is listed by ", target,
                                              " but missing from ", file.path()));
    }
    ckpt->owner_[name] = it->second;
  }
  return ckpt;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(owner_.size());
  for (const auto& [name, slot] : owner_) out.push_back(name);
  return out;
}

const SafetensorInfo* SafetensorsCheckpoint::Find(const std::string& name) const {
  auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : files_[it->second]->Find(name);
}

std::string SafetensorsCheckpoint::FileOf(const std::string& name) const {
  auto it = owner_.find(name);
  return it == owner_.end() ? std::string() : files_[it->second]->path();
}

absl::StatusOr<torch::Tensor> SafetensorsCheckpoint::Get(
    const std::string& name, std::optional<torch::ScalarType> dtype) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor ", name, " not found in ", path_));
  }
  return files_[it->second]->Get(name, dtype);
}

// ---------------------------------------------------------------------------------------------
// Writing

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::map<std::string, torch::Tensor> sorted;
  for (const NamedTensor& t : tensors) {
    if (t.name == "__metadata__" || t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor name \"", t.name, "\""));
    }
    if (!t.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " is undefined"));
    }
    if (!sorted.emplace(t.name, t.tensor).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", t.name));
    }
  }
  json header = json::object();
  json meta = json::object();
  for (const auto& [key, value] : metadata) meta[key] = value;
  if (!meta.contains("format")) meta["format"] = "pt";
  header["__metadata__"] = meta;

  // Data in order of decreasing element size (then name), as the reference writer does: with the
  // data section 8-byte aligned, every tensor then starts aligned and reads back zero-copy.
  std::vector<std::pair<std::string, torch::Tensor>> ordered(sorted.begin(), sorted.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() > b.second.element_size();
  });
  std::vector<torch::Tensor> host;
  host.reserve(ordered.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : ordered) {
    ASSIGN_OR_RETURN(std::string dtype, SafetensorsDtypeName(tensor.scalar_type()));
    host.push_back(HostContiguous(tensor));
    const uint64_t bytes = host.back().numel() * host.back().element_size();
    header[name] = {{"dtype", dtype},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_size = header_text.size();

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  char size_bytes[8];
  std::memcpy(size_bytes, &header_size, 8);  // little-endian hosts only (checked on read)
  absl::Status status = WriteAll(fd, size_bytes, 8, tmp);
  if (status.ok()) status = WriteAll(fd, header_text.data(), header_text.size(), tmp);
  for (size_t i = 0; status.ok() && i < host.size(); ++i) {
    status = WriteAll(fd, static_cast<const char*>(host[i].data_ptr()),
                      host[i].numel() * host[i].element_size(), tmp);
  }
  if (status.ok() && ::fsync(fd) != 0) {
    status = absl::InternalError(absl::StrCat("fsync ", tmp, ": ", std::strerror(errno)));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = absl::InternalError(absl::StrCat("closing ", tmp, ": ", std::strerror(errno)));
  }
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(
        absl::StrCat("renaming ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

absl::Status WriteSafetensorsCheckpoint(const std::string& dir,
                                        const std::vector<NamedTensor>& tensors,
                                        const ShardingOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  std::vector<std::vector<NamedTensor>> shards(1);
  uint64_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const NamedTensor& t : tensors) {
    if (!t.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " is undefined"));
    }
    const uint64_t bytes = t.tensor.numel() * t.tensor.element_size();
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }

  const fs::path single = fs::path(dir) / kSingleName;
  const fs::path index_path = fs::path(dir) / kIndexName;
  if (shards.size() == 1) {
    RETURN_IF_ERROR(WriteSafetensors(single.string(), shards[0]));
    fs::remove(index_path, ec);
    return absl::OkStatus();
  }

  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / name).string(), shards[i]));
    for (const NamedTensor& t : shards[i]) weight_map[t.name] = name;
  }
  json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  const std::string tmp = index_path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << index.dump(2) << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  fs::rename(tmp, index_path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  fs::remove(single, ec);
  return absl::OkStatus();
}

}  // namespace trainctl::model
