#include "tests/testing/test_pki.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/testing/subprocess.h"

namespace trainctl::testing {
namespace {

// The openssl program on $PATH (the tests' child processes are started with execve).
std::string OpensslPath() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "/usr/bin" : path, ':')) {
    const std::string candidate = absl::StrCat(dir, "/openssl");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "/usr/bin/openssl";
}

absl::Status RunOpenssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {OpensslPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  RunResult r = Run(argv, {}, absl::Seconds(30));
  if (r.exit_code == 0) return absl::OkStatus();
  std::string command;
  for (const std::string& a : argv) absl::StrAppend(&command, a, " ");
  return absl::FailedPreconditionError(
      absl::StrCat(command, "failed (exit ", r.exit_code, "): ", r.out, r.err));
}

}  // namespace

absl::StatusOr<TestPki> TestPki::Create(const std::string& dir) {
  TestPki pki;
  pki.dir_ = dir;
  pki.ca_ = {dir + "/ca.pem", dir + "/ca.key"};
  absl::Status s = RunOpenssl({"req", "-x509", "-newkey", "ec", "-pkeyopt",
                               "ec_paramgen_curve:P-256", "-nodes", "-keyout", pki.ca_.key, "-out",
                               pki.ca_.cert, "-days", "2", "-subj", "/CN=trainctl test CA"});
  if (!s.ok()) return s;
  return pki;
}

absl::StatusOr<CertFiles> TestPki::Server() {
  return Issue("server", "localhost", "DNS:localhost,IP:127.0.0.1", 1);
}

absl::StatusOr<CertFiles> TestPki::Client(const std::string& name, bool expired) {
  return Issue(expired ? name + "-expired" : name, name, "DNS:" + name, expired ? -1 : 1);
}

absl::StatusOr<CertFiles> TestPki::Issue(const std::string& file_stem,
                                         const std::string& common_name,
                                         const std::string& alt_names, int days) {
  const std::string stem = dir_ + "/" + file_stem;
  CertFiles files{stem + ".pem", stem + ".key"};
  const std::string ext = stem + ".ext";
  std::ofstream(ext) << "subjectAltName = " << alt_names << "\n"
                     << "extendedKeyUsage = serverAuth, clientAuth\n"
                     << "basicConstraints = CA:FALSE\n";
  absl::Status s =
      RunOpenssl({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                  "-keyout", files.key, "-out", stem + ".csr", "-subj", "/CN=" + common_name});
  if (!s.ok()) return s;
  // A negative -days puts notAfter before now: an expired certificate.
  s = RunOpenssl({"x509", "-req", "-in", stem + ".csr", "-CA", ca_.cert, "-CAkey", ca_.key,
                  "-CAcreateserial", "-days", absl::StrCat(days), "-extfile", ext, "-out",
                  files.cert});
  if (!s.ok()) return s;
  return files;
}

}  // namespace trainctl::testing
