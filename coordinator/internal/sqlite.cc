#include "coordinator/internal/sqlite.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace trainctl::sqlite {

absl::StatusOr<std::unique_ptr<Db>> Db::Open(const std::string& path) {
  sqlite3* raw = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string reason = raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close(raw);
    return absl::UnavailableError(absl::StrCat("cannot open database ", path, ": ", reason));
  }
  sqlite3_extended_result_codes(raw, 1);
  return std::unique_ptr<Db>(new Db(raw, path));
}

Db::~Db() {
  cache_.clear();  // finalize before closing
  sqlite3_close_v2(db_);
}

absl::Status Db::Error(int rc, absl::string_view what) const {
  const std::string message = absl::StrCat(path_, ": ", what, ": ", sqlite3_errmsg(db_));
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(
          absl::StrCat("the coordinator's storage is full (", message, "); nothing was stored"));
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
      return absl::UnavailableError(message);
    case SQLITE_CONSTRAINT:
      return absl::AlreadyExistsError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status Db::Exec(absl::string_view sql) {
  char* error = nullptr;
  const std::string text(sql);
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &error);
  sqlite3_free(error);
  if (rc != SQLITE_OK) return Error(rc, text.substr(0, 60));
  return absl::OkStatus();
}

absl::StatusOr<Statement> Db::Prepare(absl::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) return Error(rc, absl::StrCat("prepare ", sql.substr(0, 60)));
  return Statement(this, stmt);
}

absl::StatusOr<CachedStatement> Db::PrepareCached(absl::string_view sql) {
  auto it = cache_.find(sql);
  if (it == cache_.end()) {
    auto prepared = Prepare(sql);
    if (!prepared.ok()) return prepared.status();
    it = cache_.emplace(std::string(sql), std::make_unique<Statement>(std::move(*prepared))).first;
  }
  it->second->Reset();
  return CachedStatement(it->second.get());
}

absl::Status Db::ExecCached(absl::string_view sql) {
  auto st = PrepareCached(sql);
  if (!st.ok()) return st.status();
  return (*st)->Run();
}

int64_t Db::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }

Statement::~Statement() { sqlite3_finalize(stmt_); }

Statement& Statement::Bind(int index, int64_t value) {
  sqlite3_bind_int64(stmt_, index, value);
  return *this;
}
Statement& Statement::Bind(int index, absl::string_view text) {
  sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  return *this;
}
Statement& Statement::BindBlob(int index, absl::string_view bytes) {
  sqlite3_bind_blob(stmt_, index, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
  return *this;
}
Statement& Statement::BindNull(int index) {
  sqlite3_bind_null(stmt_, index);
  return *this;
}

absl::StatusOr<bool> Statement::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Error(rc, absl::StrCat("step ", absl::string_view(sqlite3_sql(stmt_)).substr(0, 60)));
}

absl::Status Statement::Run() {
  auto row = Step();
  if (!row.ok()) return row.status();
  return absl::OkStatus();
}

void Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t Statement::ColumnInt(int column) const { return sqlite3_column_int64(stmt_, column); }

std::string Statement::ColumnText(int column) const {
  const auto* text = sqlite3_column_text(stmt_, column);
  return text == nullptr ? std::string()
                         : std::string(reinterpret_cast<const char*>(text),
                                       sqlite3_column_bytes(stmt_, column));
}

std::string Statement::ColumnBlob(int column) const {
  const void* blob = sqlite3_column_blob(stmt_, column);
  return blob == nullptr
             ? std::string()
             : std::string(static_cast<const char*>(blob), sqlite3_column_bytes(stmt_, column));
}

}  // namespace trainctl::sqlite
