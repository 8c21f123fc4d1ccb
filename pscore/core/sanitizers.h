// Which sanitizer the build runs under, for the few places that must behave differently
// there: memory pools that would hide a use after free from AddressSanitizer, page moves
// ThreadSanitizer cannot follow, and tests whose sizes assume a plain build's speed or
// address space. GCC says so with __SANITIZE_*__, Clang with __has_feature.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define PSCORE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PSCORE_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define PSCORE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PSCORE_TSAN 1
#endif
#endif

namespace pscore {

#ifdef PSCORE_ASAN
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#ifdef PSCORE_TSAN
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

}  // namespace pscore
