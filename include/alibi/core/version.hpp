// SPDX-License-Identifier: MIT
// alibi's version. Kept by hand; CMake checks at configure time that it matches the
// project() VERSION in CMakeLists.txt, and the find_package consumer test checks that an
// installed copy reports the version of its package.
#pragma once

/// \file
/// The library version, as macros (for `#if`) and as a string.

/// Major version: incremented for incompatible API changes.
#define ALIBI_VERSION_MAJOR 0
/// Minor version: incremented for added functionality.
#define ALIBI_VERSION_MINOR 1
/// Patch version: incremented for fixes.
#define ALIBI_VERSION_PATCH 0
/// The version as a string, "MAJOR.MINOR.PATCH".
#define ALIBI_VERSION_STRING "0.1.0"
/// The version as one number, MAJOR * 10000 + MINOR * 100 + PATCH, for comparisons in `#if`.
#define ALIBI_VERSION \
  (ALIBI_VERSION_MAJOR * 10000 + ALIBI_VERSION_MINOR * 100 + ALIBI_VERSION_PATCH)
