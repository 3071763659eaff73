#include "common/credentials.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/credential_file.h"
#include "common/status_macros.h"

namespace trainctl {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

Cert FirstCertificate(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  return Cert(bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadCredentialFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": cannot read ", path, " (missing or not readable): ", text.status().message()));
  }
  std::string pem = *std::move(text);
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return pem;
}

absl::StatusOr<std::string> ReadCertificates(const std::string& flag, const std::string& path) {
  ASSIGN_OR_RETURN(std::string pem, ReadPem(flag, path));
  if (FirstCertificate(pem) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM certificate (BEGIN CERTIFICATE)"));
  }
  return pem;
}

// The cert and key files, checked to belong together.
struct KeyPair {
  std::string cert;
  std::string key;
};
absl::StatusOr<KeyPair> ReadKeyPair(const TlsOptions& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        tls.cert.empty() ? "--tls_key needs --tls_cert (the certificate of that key)"
                         : "--tls_cert needs --tls_key (the certificate's private key)");
  }
  KeyPair pair;
  if (tls.cert.empty()) return pair;
  ASSIGN_OR_RETURN(pair.cert, ReadCertificates("--tls_cert", tls.cert));
  ASSIGN_OR_RETURN(pair.key, ReadPem("--tls_key", tls.key));
  Bio bio = MemoryBio(pair.key);
  Key key(bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: ", tls.key, " holds no unencrypted PEM private key (BEGIN PRIVATE KEY)"));
  }
  Cert cert = FirstCertificate(pair.cert);
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: ", tls.key, " is not the private key of the certificate in ", tls.cert));
  }
  return pair;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert.empty() && tls.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS on the server needs --tls_cert and --tls_key (--tls_ca alone only verifies clients)");
  }
  ASSIGN_OR_RETURN(KeyPair pair, ReadKeyPair(tls));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({pair.key, pair.cert});
  if (!tls.ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadCertificates("--tls_ca", tls.ca));
    options.client_certificate_request =
        tls.require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  } else if (tls.require_client_cert) {
    return absl::InvalidArgumentError(
        "requiring client certificates needs --tls_ca (the CA that signs them)");
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  ASSIGN_OR_RETURN(KeyPair pair, ReadKeyPair(tls));
  grpc::SslCredentialsOptions options;
  if (!tls.ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadCertificates("--tls_ca", tls.ca));
  }
  options.pem_cert_chain = std::move(pair.cert);
  options.pem_private_key = std::move(pair.key);
  return grpc::SslCredentials(options);
}

absl::StatusOr<std::vector<std::string>> CertificateNames(const std::string& pem) {
  Cert cert = FirstCertificate(pem);
  if (cert == nullptr) return absl::InvalidArgumentError("no PEM certificate");
  std::vector<std::string> names;
  char cn[256] = {};
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (subject != nullptr &&
      X509_NAME_get_text_by_NID(subject, NID_commonName, cn, sizeof(cn)) > 0) {
    names.emplace_back(cn);
  }
  auto* sans = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  if (sans != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
      if (name->type != GEN_DNS) continue;
      const ASN1_IA5STRING* dns = name->d.dNSName;
      std::string text(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                       ASN1_STRING_length(dns));
      if (std::find(names.begin(), names.end(), text) == names.end()) {
        names.push_back(std::move(text));
      }
    }
    GENERAL_NAMES_free(sans);
  }
  return names;
}

}  // namespace trainctl
