// Certificates for the TLS tests, made with libcrypto at run time (no openssl command, no
// files in the repository that expire): a CA, certificates it signs, and a stranger's
// certificate signed by another CA. EC P-256 keys, SHA-256 signatures, valid for a day.
#pragma once

#include "base/tls.hpp"

#include <string>

namespace braid::test {

class TestPki {
 public:
  /// Writes the CA under a fresh directory (test_support's temp_path).
  TestPki();
  /// Removes the directory and every file in it.
  ~TestPki();
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;
  /// A certificate with common name `cn` signed by this CA (PEM files, made on first use).
  base::tls::Files member(const std::string& cn);
  /// A certificate that another CA signed, presented with this CA as the bundle: what a
  /// host outside the cluster would hold.
  base::tls::Files stranger();
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

}  // namespace braid::test
