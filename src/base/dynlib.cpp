#include "base/dynlib.hpp"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>

namespace braid::base {

void* open_library(const std::string& path, const std::string& hint, std::string* why) {
  // RTLD_LOCAL: the library's symbols stay out of the global namespace, so a program that
  // links its own copy (Open MPI's UCX or PMIx) does not get ours mixed into its lookups.
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr && why != nullptr) {
    const char* e = ::dlerror();
    *why = "cannot load " + path + ": " + (e ? e : "unknown error") + (hint.empty() ? "" : " (" + hint + ")");
  }
  return h;
}

void* find_symbol(void* handle, const char* name, const char* version) {
  void* sym = version ? ::dlvsym(handle, name, version) : nullptr;
  // A library without symbol versions (a test provider, another build) has only the name.
  if (sym == nullptr) sym = ::dlsym(handle, name);
  return sym;
}

std::string library_file(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr ||
      map->l_name[0] == '\0')
    return fallback;
  char buf[PATH_MAX];
  if (::realpath(map->l_name, buf) != nullptr) return buf;
  return map->l_name;
}

}  // namespace braid::base
