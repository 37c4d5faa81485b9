// Optional libraries loaded at run time (libucp, libibverbs, libpmix): dlopen with
// RTLD_NOW | RTLD_LOCAL, entry points resolved by name into a caller's table, and the
// first missing name reported. libbraid.so keeps no NEEDED entry on any of them, so one
// build runs where they are absent and says why (DESIGN.md §1).
//
// The handle of a library that is used is never closed: these libraries start threads and
// register atexit handlers, so unloading them is never safe.
#pragma once

#include <string>

namespace braid::base {

/// dlopen(path, RTLD_NOW | RTLD_LOCAL). Null on failure, with "cannot load <path>: <dlerror>
/// (<hint>)" in *why (the hint says what to install or which variable points elsewhere).
void* open_library(const std::string& path, const std::string& hint, std::string* why);

/// dlvsym(handle, name, version) when `version` is given and found, else dlsym(handle, name).
void* find_symbol(void* handle, const char* name, const char* version = nullptr);

/// Resolves `name` into *out; when absent, records it in *missing (the first only) and
/// leaves *out null. Resolve a whole table, then check `missing` once.
template <typename F>
void resolve(void* handle, const char* name, F* out, std::string* missing, const char* version = nullptr) {
  void* sym = find_symbol(handle, name, version);
  *out = reinterpret_cast<F>(sym);
  if (sym == nullptr && missing->empty()) *missing = name;
}

/// The file behind a handle, symbolic links resolved ("libibverbs.so.1" ->
/// ".../libibverbs.so.1.14.44.0"); `fallback` when the loader does not say.
std::string library_file(void* handle, const std::string& fallback);

}  // namespace braid::base
