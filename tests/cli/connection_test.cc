// Where trainctl's connection settings come from (cli/connection.h): flags over environment over
// the config file over defaults, and the token from the environment or the token files, with a
// HOME made for each test.
#include "cli/connection.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/client_config.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_pki.h"

namespace trainctl::cli {
namespace {

using Addresses = std::vector<std::string>;

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
  EXPECT_EQ(c->addresses, Addresses{"127.0.0.1:50051"});
  EXPECT_FALSE(c->tls.enabled());
  EXPECT_EQ(c->token, "");
  EXPECT_NE(c->credentials, nullptr);
}

TEST_F(ConnectionTest, FlagsBeatTheEnvironmentWhichBeatsTheConfigFile) {
  WriteConfig("# mine\ncoordinator = from-config:1\ntls_ca = ~/ca.pem\n");
  dir_.Write("home/ca.pem", testing::ReadFileOrEmpty(ca_));
  auto config = ResolveConnection({}, env_);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->addresses, Addresses{"from-config:1"});
  EXPECT_EQ(config->tls.ca, env_.home + "/ca.pem") << "~/ is HOME";

  env_.coordinator = "from-env:2";
  env_.tls_ca = ca_;
  auto env = ResolveConnection({}, env_);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->addresses, Addresses{"from-env:2"});
  EXPECT_EQ(env->tls.ca, ca_);

  auto flags = ResolveConnection({{"coordinator", "from-flag:3"}}, env_);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->addresses, Addresses{"from-flag:3"});
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
    EXPECT_EQ(c->addresses, Addresses{want}) << given;
  }
  env_.coordinator = "from-env";
  auto env = ResolveConnection({}, env_);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->addresses, Addresses{"from-env:50051"});
  for (const char* bad : {"host:", "host:http", "host:0", "host:65536", ":7000", "[::1"}) {
    auto c = ResolveConnection({{"coordinator", bad}}, env_);
    ASSERT_FALSE(c.ok()) << bad << " resolved to " << c->addresses.front();
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), std::string("'") + bad + "'"))
        << c.status();
  }
}

// An active coordinator and its standbys: a comma-separated list, from any source, each address
// as above, in the order given; an empty, malformed or repeated item is refused, naming it.
TEST_F(ConnectionTest, ACoordinatorListKeepsItsOrderAndRefusesBadItems) {
  auto flags = ResolveConnection({{"coordinator", "10.0.0.1:7000, 10.0.0.2 ,[::1]"}}, env_);
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->addresses, (Addresses{"10.0.0.1:7000", "10.0.0.2:50051", "[::1]:50051"}));
  env_.coordinator = "b:2,a:1";
  auto env = ResolveConnection({}, env_);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->addresses, (Addresses{"b:2", "a:1"}));
  WriteConfig("coordinator = c:3,d:4\n");
  env_.coordinator.clear();
  EXPECT_EQ(ResolveConnection({}, env_)->addresses, (Addresses{"c:3", "d:4"}));

  EXPECT_EQ(*CoordinatorTargets("one"), Addresses{"one:50051"});
  for (const auto& [list, named] : std::vector<std::pair<std::string, std::string>>{
           {"a:1,,b:2", "item 2 is empty"},
           {"a:1,", "item 2 is empty"},
           {" ", "item 1 is empty"},
           {"a:1,b:http", "'b:http'"},
           {"a:1, a:1", "'a:1': given twice"},
           {"a,a:50051", "'a:50051': given twice (as a:50051)"}}) {
    auto targets = CoordinatorTargets(list);
    ASSERT_FALSE(targets.ok()) << list;
    EXPECT_EQ(targets.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_TRUE(absl::StrContains(targets.status().message(), named))
        << list << ": " << targets.status();
    EXPECT_FALSE(ResolveConnection({{"coordinator", list}}, env_).ok()) << list;
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
