// Where trainctl's connection settings come from (cli/connection.h): flags over environment over
// the config file over defaults, and the token from the environment or the token files, with a
// HOME made for each test.
#include "cli/connection.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_pki.h"

namespace trainctl::cli {
namespace {

class ConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = testing::TestPki::Create(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    ca_ = pki->ca();
    env_.home = dir_.path() + "/home";
  }
  void WriteConfig(const std::string& text) { dir_.Write("home/.config/trainctl/config", text); }

  testing::TempDir dir_;
  std::string ca_;
  ClientEnvironment env_;
};

TEST_F(ConnectionTest, DefaultsArePlaintextLocalhostWithoutAToken) {
  auto c = ResolveConnection({}, env_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address, "127.0.0.1:50051");
  EXPECT_FALSE(c->tls.enabled());
  EXPECT_EQ(c->token, "");
  EXPECT_NE(c->credentials, nullptr);
}

TEST_F(ConnectionTest, FlagsBeatTheEnvironmentWhichBeatsTheConfigFile) {
  WriteConfig("# mine\ncoordinator = from-config:1\ntls_ca = ~/ca.pem\n");
  dir_.Write("home/ca.pem", testing::ReadFileOrEmpty(ca_));
  auto config = ResolveConnection({}, env_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->address, "from-config:1");
  EXPECT_EQ(config->tls.ca, env_.home + "/ca.pem") << "~/ is HOME";

  env_.coordinator = "from-env:2";
  env_.tls_ca = ca_;
  auto env = ResolveConnection({}, env_);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->address, "from-env:2");
  EXPECT_EQ(env->tls.ca, ca_);

  auto flags = ResolveConnection({{"coordinator", "from-flag:3"}}, env_);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->address, "from-flag:3");
}

// An address without a port gets the coordinator's documented port, 50051 (gRPC's resolver would
// otherwise dial 443); a malformed port is refused, naming the address.
TEST_F(ConnectionTest, AnAddressWithoutAPortGetsTheDefaultPort) {
  for (const auto& [given, want] : std::vector<std::pair<std::string, std::string>>{
           {"localhost", "localhost:50051"},
           {"10.0.0.1", "10.0.0.1:50051"},
           {"coordinator.example:7000", "coordinator.example:7000"},
           {"[::1]", "[::1]:50051"},
           {"[::1]:7000", "[::1]:7000"},
           {"::1", "[::1]:50051"},
           {"dns:///coordinator.example:7000", "dns:///coordinator.example:7000"},
           {"unix:/run/trainctl.sock", "unix:/run/trainctl.sock"}}) {
    auto c = ResolveConnection({{"coordinator", given}}, env_);
    ASSERT_TRUE(c.ok()) << given << ": " << c.status();
    EXPECT_EQ(c->address, want) << given;
  }
  env_.coordinator = "from-env";
  auto env = ResolveConnection({}, env_);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->address, "from-env:50051");
  for (const char* bad : {"host:", "host:http", "host:0", "host:65536", ":7000", "[::1"}) {
    auto c = ResolveConnection({{"coordinator", bad}}, env_);
    ASSERT_FALSE(c.ok()) << bad << " resolved to " << c->address;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), std::string("'") + bad + "'"))
        << c.status();
  }
}

TEST_F(ConnectionTest, TokenFromTheEnvironmentElseTheConfiguredFileElseTheDefaultFile) {
  dir_.Write("home/.config/trainctl/token", "default-token\n");
  EXPECT_EQ(ResolveConnection({}, env_)->token, "default-token");
  WriteConfig("token_file = ~/other-token\n");
  dir_.Write("home/other-token", "  other-token  \n");
  EXPECT_EQ(ResolveConnection({}, env_)->token, "other-token");
  env_.token = "env-token";
  EXPECT_EQ(ResolveConnection({}, env_)->token, "env-token");
}

TEST_F(ConnectionTest, MistakesNameTheFileAndLine) {
  WriteConfig("coordinator = a:1\ncoordinater = b:2\n");
  auto typo = ResolveConnection({}, env_);
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(typo.status().message(), ".config/trainctl/config:2:"))
      << typo.status();
  WriteConfig("token_file = ~/missing\n");
  auto token = ResolveConnection({}, env_);
  EXPECT_TRUE(absl::StrContains(token.status().message(), env_.home + "/missing"))
      << token.status();
  WriteConfig("");
  auto ca = ResolveConnection({{"tls_ca", dir_.path() + "/nope.pem"}}, env_);
  EXPECT_TRUE(absl::StrContains(ca.status().message(), "--tls_ca: cannot read")) << ca.status();
}

TEST(ConnectionOptionsTest, OnlyVerbsThatTalkToTheCoordinatorGetThem) {
  std::vector<OptionSpec> remote = {{"coordinator", "", true}, {"output", "-o", true}};
  EXPECT_TRUE(AddConnectionOptions(&remote));
  EXPECT_EQ(remote.size(), 5u);
  std::vector<OptionSpec> offline = {{"output", "-o", true}};
  EXPECT_FALSE(AddConnectionOptions(&offline));
  EXPECT_EQ(offline.size(), 1u);
}

}  // namespace
}  // namespace trainctl::cli
