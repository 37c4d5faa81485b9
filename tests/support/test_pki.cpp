#include "test_pki.hpp"

#include "test_support.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <sys/stat.h>

namespace braid::test {
namespace {

EVP_PKEY* new_key() {
  EVP_PKEY* k = EVP_EC_gen("P-256");
  if (k == nullptr) throw std::runtime_error("test pki: EC key generation failed");
  return k;
}

void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) throw std::runtime_error("test pki: bad extension");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

/// A certificate for `key` named `cn`, signed by (issuer, issuer_key); self-signed when
/// issuer is null.
X509* make_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, bool ca, long serial) {
  X509* c = X509_new();
  X509_set_version(c, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c), serial);
  X509_gmtime_adj(X509_getm_notBefore(c), -3600);
  X509_gmtime_adj(X509_getm_notAfter(c), 86400);
  X509_set_pubkey(c, key);
  X509_NAME* name = X509_get_subject_name(c);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(c, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : c;
  if (ca) {
    add_ext(c, signer, NID_basic_constraints, "critical,CA:TRUE");
    add_ext(c, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_ext(c, signer, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(c, signer, NID_ext_key_usage, "serverAuth,clientAuth");
  }
  if (X509_sign(c, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0)
    throw std::runtime_error("test pki: signing failed");
  return c;
}

void write_cert(const std::string& path, X509* c) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || PEM_write_X509(f, c) != 1) throw std::runtime_error("test pki: cannot write " + path);
  std::fclose(f);
}

void write_key(const std::string& path, EVP_PKEY* k) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    throw std::runtime_error("test pki: cannot write " + path);
  std::fclose(f);
}

struct Ca {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  ~Ca() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

void load_ca(const std::string& dir, const std::string& stem, Ca* ca) {
  FILE* f = std::fopen((dir + "/" + stem + ".pem").c_str(), "r");
  ca->cert = f != nullptr ? PEM_read_X509(f, nullptr, nullptr, nullptr) : nullptr;
  if (f != nullptr) std::fclose(f);
  f = std::fopen((dir + "/" + stem + ".key").c_str(), "r");
  ca->key = f != nullptr ? PEM_read_PrivateKey(f, nullptr, nullptr, nullptr) : nullptr;
  if (f != nullptr) std::fclose(f);
  if (ca->cert == nullptr || ca->key == nullptr) throw std::runtime_error("test pki: cannot read the CA " + stem);
}

void make_ca(const std::string& dir, const std::string& stem, const std::string& cn) {
  Ca ca;
  ca.key = new_key();
  ca.cert = make_cert(ca.key, cn, nullptr, nullptr, true, 1);
  write_cert(dir + "/" + stem + ".pem", ca.cert);
  write_key(dir + "/" + stem + ".key", ca.key);
}

base::tls::Files issue(const std::string& dir, const std::string& ca_stem, const std::string& cn) {
  Ca ca;
  load_ca(dir, ca_stem, &ca);
  EVP_PKEY* key = new_key();
  static long serial = 100;
  X509* cert = make_cert(key, cn, ca.cert, ca.key, false, ++serial);
  base::tls::Files f{dir + "/" + cn + ".pem", dir + "/" + cn + ".key", dir + "/ca.pem"};
  write_cert(f.cert, cert);
  write_key(f.key, key);
  X509_free(cert);
  EVP_PKEY_free(key);
  return f;
}

}  // namespace

TestPki::TestPki() : dir_(temp_path("pki")) {
  ::mkdir(dir_.c_str(), 0700);
  make_ca(dir_, "ca", "braid test CA");
  make_ca(dir_, "other-ca", "another CA");
}

TestPki::~TestPki() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

base::tls::Files TestPki::member(const std::string& cn) { return issue(dir_, "ca", cn); }

base::tls::Files TestPki::stranger() { return issue(dir_, "other-ca", "stranger"); }

}  // namespace braid::test
