# Checks the installed alibi.pc: run as
#   cmake -DPKG_CONFIG=<pkg-config> -DCXX=<compiler> -DPREFIX=<install prefix>
#         -DEXPECT_VERSION=<version> -DSOURCE=<pkg_config.cpp> -P check.cmake
# pkg-config must find the package under PREFIX, report the version, and its --cflags must be
# enough to compile a file that includes <alibi/core/version.hpp> (from PREFIX) and <Eigen/Core>.
foreach(var IN ITEMS PKG_CONFIG CXX PREFIX EXPECT_VERSION SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is required")
  endif()
endforeach()
file(GLOB pc_files "${PREFIX}/*/pkgconfig/alibi.pc" "${PREFIX}/*/*/pkgconfig/alibi.pc")
if(NOT pc_files)
  message(FATAL_ERROR "no alibi.pc installed under ${PREFIX}")
endif()
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir "${pc_file}" DIRECTORY)
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
message(STATUS "alibi.pc: ${pc_file}")

execute_process(COMMAND ${PKG_CONFIG} --modversion alibi
  OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT version STREQUAL EXPECT_VERSION)
  message(FATAL_ERROR "pkg-config --modversion alibi: '${version}' (exit ${rc}), expected ${EXPECT_VERSION}")
endif()
execute_process(COMMAND ${PKG_CONFIG} --cflags alibi
  OUTPUT_VARIABLE cflags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags alibi failed (exit ${rc})")
endif()
message(STATUS "pkg-config --cflags alibi: ${cflags}")

# One -I must be the installed include directory.
separate_arguments(flags UNIX_COMMAND "${cflags}")
get_filename_component(want "${PREFIX}/include" REALPATH)
set(found FALSE)
foreach(flag IN LISTS flags)
  if(flag MATCHES "^-I(.+)")
    get_filename_component(dir "${CMAKE_MATCH_1}" REALPATH)
    if(dir STREQUAL want)
      set(found TRUE)
    endif()
  endif()
endforeach()
if(NOT found)
  message(FATAL_ERROR "pkg-config --cflags alibi has no -I for ${want}: ${cflags}")
endif()

execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only ${flags}
  -DEXPECT_VERSION="${EXPECT_VERSION}" ${SOURCE} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} with pkg-config --cflags alibi failed")
endif()
message(STATUS "pkg-config: alibi ${version} found and compiles")
