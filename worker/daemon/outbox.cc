#include "worker/daemon/outbox.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainctl::worker {

namespace v1 = trainctl::v1;

Outbox::Outbox(std::string spill_path, size_t memory_limit_bytes)
    : spill_path_(std::move(spill_path)), memory_limit_(memory_limit_bytes) {}

Outbox::~Outbox() {
  absl::MutexLock lock(&mu_);
  if (spill_ != nullptr) {
    std::fclose(spill_);
    std::remove(spill_path_.c_str());
  }
}

int64_t Outbox::Push(v1::WorkerMessage message) {
  absl::MutexLock lock(&mu_);
  const int64_t seq = next_seq_++;
  message.set_seq(seq);
  const size_t size = message.ByteSizeLong();
  // Spill once memory is full, and keep spilling while anything is on disk (order).
  if (spill_status_.ok() && !spill_path_.empty() &&
      (spilled_ > 0 || memory_bytes_ + size > memory_limit_)) {
    if (spill_ == nullptr) {
      spill_ = std::fopen(spill_path_.c_str(), "w+b");
      if (spill_ == nullptr) {
        spill_status_ = absl::UnavailableError(
            absl::StrCat("outbox spill file ", spill_path_, ": ", std::strerror(errno)));
      }
    }
    if (spill_ != nullptr) {
      const std::string bytes = message.SerializeAsString();
      const uint64_t n = bytes.size();
      std::fseek(spill_, 0, SEEK_END);
      const long end = std::ftell(spill_);
      if (std::fwrite(&n, sizeof(n), 1, spill_) == 1 &&
          std::fwrite(bytes.data(), 1, bytes.size(), spill_) == bytes.size() &&
          std::fflush(spill_) == 0) {
        ++spilled_;
        spilled_bytes_ += static_cast<int64_t>(sizeof(n) + bytes.size());
        return seq;
      }
      spill_status_ = absl::UnavailableError(absl::StrCat(
          "outbox spill file ", spill_path_, ": write failed: ", std::strerror(errno)));
      // Drop the torn record, then bring every spilled message back so memory stays in seq order
      // (from now on everything is kept in memory).
      (void)!ftruncate(fileno(spill_), end);  // best effort: the records before it are whole
      RefillLocked(/*all=*/true);
    }
  }
  memory_bytes_ += size;
  memory_.push_back(std::move(message));
  return seq;
}

void Outbox::RefillLocked(bool all) {
  while (spilled_ > 0 && (all || memory_bytes_ < memory_limit_ / 2)) {
    uint64_t n = 0;
    std::fseek(spill_, spill_read_offset_, SEEK_SET);
    std::string bytes;
    if (std::fread(&n, sizeof(n), 1, spill_) == 1) {
      bytes.resize(n);
      if (std::fread(bytes.data(), 1, n, spill_) != n) bytes.clear();
    }
    v1::WorkerMessage message;
    if (bytes.empty() || !message.ParseFromString(bytes)) {
      spill_status_ = absl::DataLossError(
          absl::StrCat("outbox spill file ", spill_path_, " is unreadable at offset ",
                       spill_read_offset_, "; ", spilled_, " messages lost"));
      spilled_ = 0;
      spilled_bytes_ = 0;
      break;
    }
    const long offset = std::ftell(spill_);
    spilled_bytes_ -= offset - spill_read_offset_;
    spill_read_offset_ = offset;
    --spilled_;
    memory_bytes_ += message.ByteSizeLong();
    memory_.push_back(std::move(message));
  }
  if (spilled_ == 0 && spill_ != nullptr) {
    // Everything is back in memory: start the file again.
    std::fclose(spill_);
    spill_ = nullptr;
    spill_read_offset_ = 0;
    spilled_bytes_ = 0;
    std::remove(spill_path_.c_str());
  }
}

std::vector<v1::WorkerMessage> Outbox::WaitNext(int64_t after_seq, int max, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, after_seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || (!memory_.empty() && memory_.back().seq() > after_seq);
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  std::vector<v1::WorkerMessage> out;
  if (closed_) return out;
  // Only what is in memory is sent; the rest follows as acks make room.
  for (const v1::WorkerMessage& m : memory_) {
    if (m.seq() <= after_seq) continue;
    if (static_cast<int>(out.size()) >= max) break;
    out.push_back(m);
  }
  return out;
}

void Outbox::Ack(int64_t through_seq) {
  absl::MutexLock lock(&mu_);
  if (through_seq <= acked_) return;
  acked_ = through_seq;
  while (!memory_.empty() && memory_.front().seq() <= through_seq) {
    memory_bytes_ -= memory_.front().ByteSizeLong();
    memory_.pop_front();
  }
  RefillLocked(/*all=*/false);
}

absl::StatusOr<v1::WorkerMessage> Outbox::SetAside(int64_t seq) {
  absl::MutexLock lock(&mu_);
  for (auto it = memory_.begin(); it != memory_.end(); ++it) {
    if (it->seq() != seq) continue;
    v1::WorkerMessage message = std::move(*it);
    memory_.erase(it);
    memory_bytes_ -= message.ByteSizeLong();
    RefillLocked(/*all=*/false);
    return message;
  }
  return absl::NotFoundError(absl::StrCat("outbox holds no message ", seq, " in memory"));
}

void Outbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

int64_t Outbox::acked_through() {
  absl::MutexLock lock(&mu_);
  return acked_;
}
int64_t Outbox::last_seq() {
  absl::MutexLock lock(&mu_);
  return next_seq_ - 1;
}
int64_t Outbox::first_held() {
  absl::MutexLock lock(&mu_);
  return memory_.empty() ? 0 : memory_.front().seq();
}
size_t Outbox::held() {
  absl::MutexLock lock(&mu_);
  return memory_.size() + spilled_;
}
size_t Outbox::spilled() {
  absl::MutexLock lock(&mu_);
  return spilled_;
}
int64_t Outbox::spilled_bytes() {
  absl::MutexLock lock(&mu_);
  return spilled_bytes_;
}
absl::Status Outbox::spill_status() {
  absl::MutexLock lock(&mu_);
  return spill_status_;
}

}  // namespace trainctl::worker
