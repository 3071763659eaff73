// A thin RAII layer over libpq (PostgreSQL's C client): a connection that reconnects when its
// server went away, statements prepared once per connection, parameters and results in binary,
// and errors as absl::Status naming the server and the statement. Not thread-safe: one user at a
// time.
//
// Status codes: the server unreachable or gone (SQLSTATE classes 08, 57P, 40, 53 but 53100) or a
// lock not granted in time (55P03) is
// UNAVAILABLE; its disk full (53100) RESOURCE_EXHAUSTED — both IsTransientStoreError; a unique
// violation ALREADY_EXISTS; bad data (classes 22, 23) INVALID_ARGUMENT; anything else INTERNAL.
#ifndef TRAINCTL_COORDINATOR_INTERNAL_PG_H_
#define TRAINCTL_COORDINATOR_INTERNAL_PG_H_

#include <libpq-fe.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::pg {

// Whether `db` names a PostgreSQL database (postgresql:// or postgres://, libpq's URI schemes).
bool IsPostgresUri(absl::string_view db);
// `uri` without its password, for messages and logs.
std::string RedactUri(absl::string_view uri);

// A statement's parameters ($1, $2, ... in the order added), sent in binary.
class Params {
 public:
  Params& Int(int64_t value);              // int8
  Params& Text(absl::string_view text);    // text: UTF-8 without NUL bytes
  Params& Bytes(absl::string_view bytes);  // bytea
  Params& NullText();

  int size() const { return static_cast<int>(types_.size()); }
  const Oid* types() const { return types_.data(); }
  // Valid until the next change.
  std::vector<const char*> Values() const;
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }

 private:
  Params& Add(Oid type, std::string value, bool null);
  std::vector<Oid> types_;
  std::vector<std::string> values_;
  std::vector<bool> null_;
  std::vector<int> lengths_;
  std::vector<int> formats_;
};

// The rows of one statement, in binary.
class Result {
 public:
  explicit Result(PGresult* result) : result_(result, &PQclear) {}
  int rows() const { return PQntuples(result_.get()); }
  // An int2, int4 or int8 column; 0 for NULL.
  int64_t Int(int row, int column) const;
  // A text or bytea column's bytes.
  std::string Bytes(int row, int column) const;
  // The statement's tag ("INSERT 0 1", "COMMIT", "ROLLBACK").
  std::string Tag() const { return PQcmdStatus(result_.get()); }
  const PGresult* raw() const { return result_.get(); }

 private:
  std::unique_ptr<PGresult, void (*)(PGresult*)> result_;
};

// A statement run on every new connection: a session setting, or a check (a query whose first
// column answers true, else the connection is not used, UNAVAILABLE with `if_false`, and the next
// call tries again).
struct SetupStatement {
  std::string sql;
  std::string if_false;
};

class Conn {
 public:
  // Connects to `uri` (a libpq URI) and runs `setup` on this connection and on every reconnection.
  // UNAVAILABLE naming the server when it cannot be reached.
  static absl::StatusOr<std::unique_ptr<Conn>> Open(const std::string& uri,
                                                    std::vector<SetupStatement> setup);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Connects again when the connection was lost (the server restarted, a network failure);
  // nothing when it is up. The statements prepared on the lost connection are forgotten.
  absl::Status EnsureConnected();
  // Runs one or more statements without parameters (migrations, BEGIN, COMMIT). A COMMIT that the
  // server turned into a rollback (the transaction had failed) is ABORTED. A BEGIN on a connection
  // the server dropped while it was idle connects again and begins there.
  absl::Status Exec(absl::string_view sql);
  // Same as Exec: the name the group commit (internal/group_commit.h) calls.
  absl::Status ExecCached(absl::string_view sql) { return Exec(sql); }
  // Runs `sql` as a statement prepared once per connection (with the parameter types of its first
  // call) and returns its rows.
  absl::StatusOr<Result> Query(absl::string_view sql, const Params& params = Params());

  // Adds a statement to run on every later reconnection (not now).
  void AddSetup(SetupStatement setup) { setup_.push_back(std::move(setup)); }

  const std::string& name() const { return name_; }
  // Connected, and the setup statements ran on this connection.
  bool connected() const { return PQstatus(conn_) == CONNECTION_OK && setup_ok_; }

 private:
  Conn(PGconn* conn, std::string uri, std::vector<SetupStatement> setup);
  absl::Status RunSetup();
  absl::Status ExecOnce(absl::string_view sql);
  // The status for a failed `result` of `what` (null: the connection failed).
  absl::Status Error(const PGresult* result, absl::string_view what) const;

  PGconn* conn_;
  const std::string uri_;
  const std::string name_;  // uri_ without a password
  std::vector<SetupStatement> setup_;
  bool setup_ok_ = false;  // a reconnection whose setup failed is not used: the next call retries
  std::map<std::string, std::string, std::less<>> prepared_;  // sql -> statement name
};

}  // namespace trainctl::pg

#endif  // TRAINCTL_COORDINATOR_INTERNAL_PG_H_
