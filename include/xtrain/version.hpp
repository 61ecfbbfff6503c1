#pragma once
/// \file version.hpp
/// Library version: the one place it is written (CMakeLists.txt reads these three lines).

#define XTRAIN_VERSION_MAJOR 0
#define XTRAIN_VERSION_MINOR 2
#define XTRAIN_VERSION_PATCH 0

#define XTRAIN_VERSION_STRINGIFY_(x) #x
#define XTRAIN_VERSION_STRINGIFY(x) XTRAIN_VERSION_STRINGIFY_(x)

namespace xtrain {
inline constexpr int version_major = XTRAIN_VERSION_MAJOR;
inline constexpr int version_minor = XTRAIN_VERSION_MINOR;
inline constexpr int version_patch = XTRAIN_VERSION_PATCH;
/// "MAJOR.MINOR.PATCH"
inline constexpr const char* version_string =
    XTRAIN_VERSION_STRINGIFY(XTRAIN_VERSION_MAJOR) "." XTRAIN_VERSION_STRINGIFY(
        XTRAIN_VERSION_MINOR) "." XTRAIN_VERSION_STRINGIFY(XTRAIN_VERSION_PATCH);
}  // namespace xtrain
