#include "coordinator/internal/pg.h"

#include <arpa/inet.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace trainctl::pg {
namespace {

// OIDs of the built-in types used here (PostgreSQL's catalog/pg_type_d.h).
constexpr Oid kBytea = 17;
constexpr Oid kInt8 = 20;
constexpr Oid kInt2 = 21;
constexpr Oid kInt4 = 23;
constexpr Oid kText = 25;

absl::StatusCode CodeOfSqlState(absl::string_view state) {
  if (state == "53100") return absl::StatusCode::kResourceExhausted;  // disk_full
  if (state == "23505") return absl::StatusCode::kAlreadyExists;      // unique_violation
  if (state == "55P03") return absl::StatusCode::kUnavailable;        // lock_not_available
  for (absl::string_view cls : {"08", "57P", "40", "53"}) {
    if (absl::StartsWith(state, cls)) return absl::StatusCode::kUnavailable;
  }
  if (absl::StartsWith(state, "22") || absl::StartsWith(state, "23")) {
    return absl::StatusCode::kInvalidArgument;
  }
  return absl::StatusCode::kInternal;
}

std::string Trimmed(const char* message) {
  return std::string(absl::StripTrailingAsciiWhitespace(message == nullptr ? "" : message));
}

// What libpq is given besides the URI: bounded waits, so that a server that is gone fails a call
// within seconds instead of hanging the writer (the URI's own settings win; they come after).
constexpr const char* kKeywords[] = {"connect_timeout",
                                     "application_name",
                                     "keepalives",
                                     "keepalives_idle",
                                     "keepalives_interval",
                                     "keepalives_count",
                                     "tcp_user_timeout",
                                     "dbname",
                                     nullptr};
constexpr const char* kValues[] = {"10", "trainctl-coordinator", "1", "5", "2", "3", "10000"};

}  // namespace

bool IsPostgresUri(absl::string_view db) {
  return absl::StartsWith(db, "postgresql://") || absl::StartsWith(db, "postgres://");
}

std::string RedactUri(absl::string_view uri) {
  std::string out(uri);
  // The query's password=... parameters.
  for (size_t at = out.find("password="); at != std::string::npos;
       at = out.find("password=", at + 12)) {
    if (at > 0 && out[at - 1] != '?' && out[at - 1] != '&') continue;
    const size_t end = out.find('&', at);
    out.replace(at + 9, (end == std::string::npos ? out.size() : end) - at - 9, "***");
  }
  // USER:PASSWORD@ before the host: everything from the first ':' to the last '@' (a password may
  // hold '/', '@' or ':').
  const size_t scheme = out.find("://");
  if (scheme == std::string::npos) return out;
  const size_t start = scheme + 3;
  const size_t query = out.find('?', start);
  const size_t at = out.rfind('@', query == std::string::npos ? std::string::npos : query);
  if (at == std::string::npos || at < start) return out;
  const size_t colon = out.find(':', start);
  if (colon == std::string::npos || colon > at) return out;
  return out.replace(colon, at - colon, ":***");
}

Params& Params::Add(Oid type, std::string value, bool null) {
  types_.push_back(type);
  lengths_.push_back(static_cast<int>(value.size()));
  values_.push_back(std::move(value));
  null_.push_back(null);
  formats_.push_back(1);
  return *this;
}

Params& Params::Int(int64_t value) {
  const uint64_t v = static_cast<uint64_t>(value);
  const uint32_t high = htonl(static_cast<uint32_t>(v >> 32));
  const uint32_t low = htonl(static_cast<uint32_t>(v));
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &high, 4);
  std::memcpy(bytes.data() + 4, &low, 4);
  return Add(kInt8, std::move(bytes), false);
}

Params& Params::Text(absl::string_view text) { return Add(kText, std::string(text), false); }
Params& Params::Bytes(absl::string_view bytes) { return Add(kBytea, std::string(bytes), false); }
Params& Params::NullText() { return Add(kText, "", true); }

std::vector<const char*> Params::Values() const {
  std::vector<const char*> out(values_.size());
  for (size_t i = 0; i < values_.size(); ++i) out[i] = null_[i] ? nullptr : values_[i].data();
  return out;
}

int64_t Result::Int(int row, int column) const {
  PGresult* r = result_.get();
  if (PQgetisnull(r, row, column)) return 0;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(PQgetvalue(r, row, column));
  uint64_t v = 0;
  for (int i = 0; i < PQgetlength(r, row, column); ++i) v = (v << 8) | p[i];
  switch (PQftype(r, column)) {
    case kInt2:
      return static_cast<int16_t>(v);
    case kInt4:
      return static_cast<int32_t>(v);
    default:
      return static_cast<int64_t>(v);
  }
}

std::string Result::Bytes(int row, int column) const {
  PGresult* r = result_.get();
  return std::string(PQgetvalue(r, row, column), PQgetlength(r, row, column));
}

Conn::Conn(PGconn* conn, std::string uri, std::vector<SetupStatement> setup)
    : conn_(conn), uri_(std::move(uri)), name_(RedactUri(uri_)), setup_(std::move(setup)) {}

Conn::~Conn() { PQfinish(conn_); }

absl::StatusOr<std::unique_ptr<Conn>> Conn::Open(const std::string& uri,
                                                 std::vector<SetupStatement> setup) {
  std::vector<const char*> values(std::begin(kValues), std::end(kValues));
  values.push_back(uri.c_str());
  values.push_back(nullptr);
  PGconn* raw = PQconnectdbParams(kKeywords, values.data(), /*expand_dbname=*/1);
  if (raw == nullptr) return absl::ResourceExhaustedError("libpq: out of memory");
  std::unique_ptr<Conn> conn(new Conn(raw, uri, std::move(setup)));
  // Server notices (a ROLLBACK with no transaction left, ...) are not errors: not printed.
  PQsetNoticeProcessor(
      raw, [](void*, const char*) {}, nullptr);
  if (PQstatus(raw) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat(conn->name_, ": cannot connect: ", Trimmed(PQerrorMessage(raw))));
  }
  if (absl::Status s = conn->RunSetup(); !s.ok()) return s;
  conn->setup_ok_ = true;
  return conn;
}

absl::Status Conn::RunSetup() {
  for (const SetupStatement& setup : setup_) {
    // Text results: a check's boolean reads "t" or "f".
    PGresult* raw =
        PQexecParams(conn_, setup.sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0);
    Result result(raw);
    const ExecStatusType status = raw == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(raw);
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Error(raw, setup.sql);
    if (status == PGRES_TUPLES_OK && result.rows() > 0 &&
        absl::string_view(PQgetvalue(raw, 0, 0)) == "f") {
      return absl::UnavailableError(absl::StrCat(name_, ": ", setup.if_false));
    }
  }
  return absl::OkStatus();
}

absl::Status Conn::EnsureConnected() {
  if (connected()) return absl::OkStatus();
  prepared_.clear();
  setup_ok_ = false;
  PQreset(conn_);
  if (PQstatus(conn_) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat(name_, ": cannot reconnect: ", Trimmed(PQerrorMessage(conn_))));
  }
  RETURN_IF_ERROR(RunSetup());
  setup_ok_ = true;
  return absl::OkStatus();
}

absl::Status Conn::Error(const PGresult* result, absl::string_view what) const {
  const char* state = result == nullptr ? nullptr : PQresultErrorField(result, PG_DIAG_SQLSTATE);
  const std::string message =
      Trimmed(result == nullptr ? PQerrorMessage(conn_) : PQresultErrorMessage(result));
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (state != nullptr) {
    code = CodeOfSqlState(state);
  } else if (result == nullptr || PQstatus(conn_) != CONNECTION_OK) {
    code = absl::StatusCode::kUnavailable;  // no answer: the connection broke
  }
  return absl::Status(code, absl::StrCat(name_, ": ", what, ": ", message));
}

absl::Status Conn::Exec(absl::string_view sql) {
  if (sql == "BEGIN") {
    absl::Status begun = ExecOnce(sql);
    if (begun.ok() || connected()) return begun;
    // Nothing was begun: a server that restarted since the last call dropped the connection.
    if (absl::Status s = EnsureConnected(); !s.ok()) return s;
  }
  return ExecOnce(sql);
}

absl::Status Conn::ExecOnce(absl::string_view sql) {
  const std::string text(sql);
  // PQexec answers with the last statement's result; it stops at the first that fails.
  Result result(PQexec(conn_, text.c_str()));
  const ExecStatusType status =
      result.raw() == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(result.raw());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Error(result.raw(), sql);
  if (sql == "COMMIT" && result.Tag() == "ROLLBACK") {
    return absl::AbortedError(absl::StrCat(name_,
                                           ": COMMIT: the transaction had failed and was "
                                           "rolled back"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Result> Conn::Query(absl::string_view sql, const Params& params) {
  auto it = prepared_.find(sql);
  if (it == prepared_.end()) {
    std::string name = absl::StrCat("s", prepared_.size() + 1);
    const std::string text(sql);
    Result prepared(PQprepare(conn_, name.c_str(), text.c_str(), params.size(), params.types()));
    if (prepared.raw() == nullptr || PQresultStatus(prepared.raw()) != PGRES_COMMAND_OK) {
      return Error(prepared.raw(), sql);
    }
    it = prepared_.emplace(text, std::move(name)).first;
  }
  const std::vector<const char*> values = params.Values();
  Result result(PQexecPrepared(conn_, it->second.c_str(), params.size(), values.data(),
                               params.lengths(), params.formats(), /*resultFormat=*/1));
  const ExecStatusType status =
      result.raw() == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(result.raw());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Error(result.raw(), sql);
  return result;
}

}  // namespace trainctl::pg
