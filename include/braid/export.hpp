// braid — symbol visibility. The library is built with hidden visibility; only
// what is marked BRAID_API is exported from libbraid.
#pragma once

#if defined(_WIN32)
#define BRAID_API
#else
/// Marks a symbol as part of braid's exported ABI.
#define BRAID_API __attribute__((visibility("default")))
#endif
