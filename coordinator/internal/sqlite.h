// A thin RAII layer over the SQLite C API: connections and prepared statements that report errors
// as absl::Status naming the database file and the statement. Not thread-safe: one user at a time.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_SQLITE_H_
#define TRAINCTL_COORDINATOR_INTERNAL_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::sqlite {

class Statement;
class CachedStatement;

class Db {
 public:
  // Opens (creating if needed) the database at `path`. UNAVAILABLE with SQLite's reason on failure.
  static absl::StatusOr<std::unique_ptr<Db>> Open(const std::string& path);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Runs one or more statements that return no rows.
  absl::Status Exec(absl::string_view sql);
  absl::StatusOr<Statement> Prepare(absl::string_view sql);
  // A statement compiled once per connection and kept, ready to bind. The handle resets it when it
  // goes out of scope, so no read transaction stays open behind a half-read result.
  absl::StatusOr<CachedStatement> PrepareCached(absl::string_view sql);
  // Runs a cached statement that takes no parameters and returns no rows (BEGIN, COMMIT, ...).
  absl::Status ExecCached(absl::string_view sql);
  int64_t LastInsertRowId() const;
  // The error for the connection's last failure, naming the file and `what`.
  absl::Status Error(int rc, absl::string_view what) const;
  const std::string& path() const { return path_; }
  sqlite3* raw() { return db_; }

 private:
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_;
  std::string path_;
  std::map<std::string, std::unique_ptr<Statement>, std::less<>> cache_;
};

class Statement {
 public:
  Statement(Statement&& other) noexcept : db_(other.db_), stmt_(other.stmt_) {
    other.stmt_ = nullptr;
  }
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;
  ~Statement();

  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, absl::string_view text);
  Statement& BindBlob(int index, absl::string_view bytes);
  Statement& BindNull(int index);

  // Advances: true when a row is ready, false when done; an error otherwise.
  absl::StatusOr<bool> Step();
  // Runs a statement that returns no rows to completion.
  absl::Status Run();
  void Reset();

  int64_t ColumnInt(int column) const;
  std::string ColumnText(int column) const;
  std::string ColumnBlob(int column) const;

 private:
  friend class Db;
  Statement(Db* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Db* db_;
  sqlite3_stmt* stmt_;
};

// A borrowed cached statement; see Db::PrepareCached.
class CachedStatement {
 public:
  explicit CachedStatement(Statement* st) : st_(st) {}
  CachedStatement(CachedStatement&& other) noexcept : st_(other.st_) { other.st_ = nullptr; }
  CachedStatement& operator=(CachedStatement&&) = delete;
  ~CachedStatement() {
    if (st_ != nullptr) st_->Reset();
  }
  Statement* operator->() const { return st_; }
  Statement& operator*() const { return *st_; }

 private:
  Statement* st_;
};

}  // namespace trainctl::sqlite

#endif  // TRAINCTL_COORDINATOR_INTERNAL_SQLITE_H_
