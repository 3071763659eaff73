// A throw-away PKI for TLS tests, made with the real `openssl` command at test time: a CA, a
// server certificate for localhost / 127.0.0.1, and client certificates (common name and DNS name
// as asked), among them an expired one. Keys are P-256, files PEM.
#ifndef TRAINCTL_TESTS_TESTING_TEST_PKI_H_
#define TRAINCTL_TESTS_TESTING_TEST_PKI_H_

#include <string>

#include "absl/status/statusor.h"

namespace trainctl::testing {

struct CertFiles {
  std::string cert;  // PEM certificate
  std::string key;   // PEM private key
};

class TestPki {
 public:
  // Makes the CA under `dir` (which must exist). FAILED_PRECONDITION with openssl's output when
  // the command fails.
  static absl::StatusOr<TestPki> Create(const std::string& dir);

  const std::string& ca() const { return ca_.cert; }
  // A server certificate for DNS:localhost and IP:127.0.0.1, signed by the CA.
  absl::StatusOr<CertFiles> Server();
  // A certificate with common name and DNS name `name`, signed by the CA, valid for a day, or
  // expired since yesterday.
  absl::StatusOr<CertFiles> Client(const std::string& name, bool expired = false);

 private:
  absl::StatusOr<CertFiles> Issue(const std::string& file_stem, const std::string& common_name,
                                  const std::string& alt_names, int days);

  std::string dir_;
  CertFiles ca_;
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TESTING_TEST_PKI_H_
