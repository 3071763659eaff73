// `trainctl logs` with a rank's control characters, from a JobService on loopback: the real CLI
// binary on a terminal (a pty from script(1)) writes them out, and piped keeps the bytes.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "trainctl/v1/job.grpc.pb.h"

namespace trainctl {
namespace {

namespace v1 = trainctl::v1;

const std::string kHostile = "\x1b[2J\x1b]0;pwned\x07step 1\r";
const std::string kNul = std::string("a\0b", 3);

// Streams two lines of `job-1`, whatever the request.
class LogsService final : public v1::JobService::Service {
  grpc::Status StreamLogs(grpc::ServerContext*, const v1::StreamLogsRequest*,
                          grpc::ServerWriter<v1::LogLine>* writer) override {
    v1::LogLine line;
    line.set_job_id("job-1");
    line.set_text(kHostile);
    writer->Write(line);
    line.set_rank(1);
    line.set_text(kNul);
    writer->Write(line);
    return grpc::Status::OK;
  }
};

class LogsTerminalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  LogsService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(LogsTerminalTest, ControlCharactersAreWrittenOutOnATerminalAndKeptInAPipe) {
  const std::string command =
      absl::StrCat(TRAINCTL_CLI_BIN, " --coordinator ", address_, " logs job-1");
  const testing::RunResult tty = testing::Run({TRAINCTL_SCRIPT_BIN, "-qec", command, "/dev/null"});
  ASSERT_EQ(tty.exit_code, 0) << tty.err << tty.out;
  EXPECT_NE(tty.out.find("[rank 0] \\x1b[2J\\x1b]0;pwned\\x07step 1\\x0d"), std::string::npos)
      << tty.out;
  EXPECT_NE(tty.out.find("[rank 1] a\\x00b"), std::string::npos) << tty.out;
  EXPECT_EQ(tty.out.find('\x1b'), std::string::npos) << "no raw ESC reaches the terminal";
  EXPECT_EQ(tty.out.find('\0'), std::string::npos) << "no raw NUL reaches the terminal";

  const testing::RunResult piped =
      testing::Run({TRAINCTL_CLI_BIN, "--coordinator", address_, "logs", "job-1"});
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.out, "[rank 0] " + kHostile + "\n[rank 1] " + kNul + "\n");
}

}  // namespace
}  // namespace trainctl
