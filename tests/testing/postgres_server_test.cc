// The PostgreSQL test server: databases that take queries, a crash (Kill) that drops connections,
// and a restart that keeps what was committed.
#include "tests/testing/postgres_server.h"

#include <libpq-fe.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainctl::testing {
namespace {

// Runs `sql` on `conn`: the first column of the first row ("" for none), or the error.
absl::StatusOr<std::string> Exec(PGconn* conn, const std::string& sql) {
  PGresult* result = PQexec(conn, sql.c_str());
  const ExecStatusType status = PQresultStatus(result);
  absl::StatusOr<std::string> value = std::string();
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    value = absl::UnavailableError(absl::StrCat(sql, ": ", PQresultErrorMessage(result)));
  } else if (status == PGRES_TUPLES_OK && PQntuples(result) > 0) {
    value = std::string(PQgetvalue(result, 0, 0));
  }
  PQclear(result);
  return value;
}

// A connection to `uri` and `sql` run on it (a fresh connection each time).
absl::StatusOr<std::string> Query(const std::string& uri, const std::string& sql) {
  PGconn* conn = PQconnectdb(uri.c_str());
  absl::StatusOr<std::string> value = absl::UnavailableError(PQerrorMessage(conn));
  if (PQstatus(conn) == CONNECTION_OK) value = Exec(conn, sql);
  PQfinish(conn);
  return value;
}

TEST(PostgresServerTest, SharedServerGivesSeparateDatabases) {
  absl::StatusOr<PostgresServer*> server = SharedPostgres();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<PostgresServer*> again = SharedPostgres();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *server);

  absl::StatusOr<std::string> first = (*server)->CreateDatabase();
  absl::StatusOr<std::string> second = (*server)->CreateDatabase();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  const std::string prefix =
      absl::StrCat("postgresql://trainctl@127.0.0.1:", (*server)->port(), "/");
  EXPECT_EQ(first->rfind(prefix, 0), 0u) << *first;

  for (const std::string& uri : {*first, *second}) {
    absl::StatusOr<std::string> one = Query(uri, "SELECT 1");
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(*one, "1");
  }
  // Empty and separate: a table in one is not in the other.
  ASSERT_TRUE(Query(*first, "CREATE TABLE only_here (x int)").ok());
  absl::StatusOr<std::string> count =
      Query(*second, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_here'");
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, "0");
}

// Started from a thread that then exits: the server outlives it (PR_SET_PDEATHSIG is per thread).
// Killed, it drops its connections and refuses new ones; restarted, it has what was committed.
TEST(PostgresServerTest, KillDropsConnectionsAndRestartKeepsCommittedRows) {
  absl::StatusOr<std::unique_ptr<PostgresServer>> started = absl::UnknownError("not run");
  std::thread([&] { started = PostgresServer::Start(); }).join();
  ASSERT_TRUE(started.ok()) << started.status();
  PostgresServer& server = **started;
  const int port = server.port();

  absl::StatusOr<std::string> uri = server.CreateDatabase();
  ASSERT_TRUE(uri.ok()) << uri.status() << "\n" << server.Log();
  ASSERT_TRUE(Query(*uri, "CREATE TABLE jobs (id int PRIMARY KEY)").ok());
  ASSERT_TRUE(Query(*uri, "INSERT INTO jobs VALUES (7)").ok());
  PGconn* open = PQconnectdb(uri->c_str());
  ASSERT_EQ(PQstatus(open), CONNECTION_OK) << PQerrorMessage(open);

  ASSERT_TRUE(server.Kill().ok());
  EXPECT_FALSE(Exec(open, "SELECT 1").ok());
  PQfinish(open);
  EXPECT_FALSE(Query(*uri, "SELECT 1").ok());
  EXPECT_EQ(server.Kill().code(), absl::StatusCode::kFailedPrecondition);

  absl::Status restarted = server.Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_EQ(server.port(), port);
  absl::StatusOr<std::string> id = Query(*uri, "SELECT id FROM jobs");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "7");
  EXPECT_EQ(server.Restart().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace trainctl::testing
