// The tokens file, token hashing and the TLS credential files' checks (common/access_tokens.h,
// common/credentials.h), on files made at test time (certificates by the openssl command).
#include "common/credentials.h"

#include <fstream>

#include "absl/strings/match.h"
#include "common/access_tokens.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_pki.h"

namespace trainctl {
namespace {

TEST(AccessTokensTest, HashesAsSha256sumDoes) {
  // printf %s secret | sha256sum
  EXPECT_EQ(Sha256Hex("secret"),
            "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(AccessTokensTest, ParsesHoldersAndAuthenticatesByHash) {
  auto table = TokenTable::Parse(
      "# who role hash\n\n"
      "alice user " +
          Sha256Hex("a-token") +
          "  # the trailing comment\n"
          "ci\tviewer\t" +
          Sha256Hex("c-token") + "\n",
      "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  auto alice = table->Authenticate("a-token");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->subject, "alice");
  EXPECT_EQ(alice->role, Role::kUser);
  EXPECT_EQ(table->Authenticate("c-token")->role, Role::kViewer);
  EXPECT_EQ(table->Authenticate("nope").status().code(), absl::StatusCode::kUnauthenticated);
  // The hash itself is not a token.
  EXPECT_FALSE(table->Authenticate(Sha256Hex("a-token")).ok());
}

TEST(AccessTokensTest, BadLinesAreErrorsNamingTheLine) {
  const std::string h = Sha256Hex("t");
  struct Case {
    std::string text;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {"alice user\n", "tokens:1: want 'SUBJECT ROLE SHA256-HEX', got 2 fields"},
           {"\nalice root " + h, "tokens:2: unknown role 'root'"},
           {"alice user my-plain-token", "tokens:1: the third field must be the token's SHA-256"},
           {"alice user " + h + "\nbob user " + h, "tokens:2: this token hash is listed twice"},
       }) {
    auto table = TokenTable::Parse(c.text, "tokens");
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(absl::StrContains(table.status().message(), c.error)) << table.status();
  }
}

TEST(AccessTokensTest, LoadNamesTheFile) {
  testing::TempDir dir;
  auto missing = TokenTable::Load(dir.path() + "/none");
  EXPECT_TRUE(absl::StrContains(missing.status().message(), dir.path() + "/none"))
      << missing.status();
  auto empty = TokenTable::Load(dir.Write("empty", "# nothing\n"));
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "holds no token")) << empty.status();
  EXPECT_EQ(*ReadTokenFile(dir.Write("token", "\n  s3cret \n")), "s3cret");
  EXPECT_FALSE(ReadTokenFile(dir.Write("blank", " \n")).ok());
}

class CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = testing::TestPki::Create(dir_.path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = std::make_unique<testing::TestPki>(*std::move(pki));
    auto server = pki_->Server();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    auto client = pki_->Client("node-7");
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *client;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::TestPki> pki_;
  testing::CertFiles server_;
  testing::CertFiles client_;
};

TEST_F(CredentialsTest, BuildsServerAndChannelCredentials) {
  EXPECT_TRUE(MakeServerCredentials({server_.cert, server_.key, pki_->ca(), false}).ok());
  EXPECT_TRUE(MakeServerCredentials({server_.cert, server_.key, "", false}).ok());
  EXPECT_TRUE(MakeChannelCredentials({client_.cert, client_.key, pki_->ca(), false}).ok());
  EXPECT_TRUE(MakeChannelCredentials({"", "", pki_->ca(), false}).ok());
  EXPECT_NE(*MakeServerCredentials(TlsOptions()), nullptr);  // plaintext
}

TEST_F(CredentialsTest, FileMistakesNameTheFlagAndTheFile) {
  const std::string missing = dir_.path() + "/missing.pem";
  const std::string text = dir_.Write("notes.txt", "not a certificate\n");
  const std::string key_only = server_.key;
  struct Case {
    TlsOptions tls;
    bool server;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {{missing, server_.key, "", false}, true, "--tls_cert: cannot read " + missing},
           {{server_.cert, missing, "", false}, true, "--tls_key: cannot read " + missing},
           {{server_.cert, server_.key, text, false}, true, "--tls_ca: " + text + " is not a PEM"},
           {{key_only, server_.key, "", false},
            true,
            "--tls_cert: " + key_only + " holds no PEM certificate"},
           {{server_.cert, client_.key, "", false}, true, "is not the private key of"},
           {{server_.cert, "", "", false}, true, "--tls_cert needs --tls_key"},
           {{"", "", pki_->ca(), false}, true, "needs --tls_cert and --tls_key"},
           {{server_.cert, server_.key, "", true}, true, "needs --tls_ca"},
           {{client_.cert, "", pki_->ca(), false}, false, "--tls_cert needs --tls_key"},
           {{"", "", missing, false}, false, "--tls_ca: cannot read " + missing},
       }) {
    absl::Status status =
        c.server ? MakeServerCredentials(c.tls).status() : MakeChannelCredentials(c.tls).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.error;
    EXPECT_TRUE(absl::StrContains(status.message(), c.error)) << status;
  }
}

TEST_F(CredentialsTest, CertificateNamesAreTheCommonNameThenDnsNames) {
  std::ifstream in(client_.cert);
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto names = CertificateNames(pem);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"node-7"}));
  EXPECT_FALSE(CertificateNames("junk").ok());
}

}  // namespace
}  // namespace trainctl
