// submit_bench's stores: the JobStore under test (SQLite on a fresh file, or PostgreSQL on a fresh
// database of a test server started for the run) and floor B, a bare durable insert of a Job-sized
// blob in its own transaction on the same store's engine, same durability, own connection.
#ifndef TRAINCTL_BENCH_SUBMIT_BENCH_STORES_H_
#define TRAINCTL_BENCH_SUBMIT_BENCH_STORES_H_

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_store.h"
#include "tests/testing/postgres_server.h"

namespace trainctl::bench {

// One measured call; each client owns its own (channel, connection, request ids).
using Op = std::function<absl::Status()>;

enum class StoreKind { kSqlite, kPostgres };

class BenchStores {
 public:
  // SQLite: the store's file and the floor's file in `dir`, `synchronous_full` as --sync.
  // PostgreSQL: a test server (tests/testing/postgres_server.h: fsync=off) with two fresh
  // databases, the store's and the floor's; `synchronous_full` is not used (every commit is
  // synchronous_commit = on, the store's setting).
  static absl::StatusOr<std::unique_ptr<BenchStores>> Open(StoreKind kind,
                                                           const std::filesystem::path& dir,
                                                           bool synchronous_full);
  // Stops the PostgreSQL server: destroy the store (TakeStore) and every floor op first.
  ~BenchStores();

  // The store under test (once).
  std::unique_ptr<JobStore> TakeStore() { return std::move(store_); }
  // Floor B on a connection of its own: BEGIN, INSERT a `blob_size` blob, COMMIT.
  absl::StatusOr<Op> NewInserter(size_t blob_size) const;

  StoreKind kind() const { return kind_; }
  // Where the store and the floor are, for the report's header.
  std::string Where() const;

 private:
  BenchStores(StoreKind kind, bool synchronous_full) : kind_(kind), sync_full_(synchronous_full) {}

  const StoreKind kind_;
  const bool sync_full_;
  std::unique_ptr<testing::PostgresServer> pg_server_;  // kPostgres
  std::unique_ptr<JobStore> store_;
  std::string store_db_;  // a path or a postgresql:// URI
  std::string floor_db_;
};

}  // namespace trainctl::bench

#endif  // TRAINCTL_BENCH_SUBMIT_BENCH_STORES_H_
