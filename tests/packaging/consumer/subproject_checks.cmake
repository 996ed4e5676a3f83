# Shared by the consumer projects that add alibi as a subproject (add_subdirectory,
# FetchContent): what the consumer asked for before alibi was added, and what alibi then did.

# asked_cuda / asked_install: whether the consumer asked for CUDA or install rules (nothing in
# the ctest runs, except CUDA in the sm_80 test; a value alibi cached in an earlier run is OFF
# and asks for nothing).
macro(alibi_consumer_record_requests)
  set(asked_cuda OFF)
  set(asked_install OFF)
  if(DEFINED CACHE{ALIBI_CUDA} AND NOT ALIBI_CUDA STREQUAL "OFF")
    set(asked_cuda ON)
  endif()
  if(DEFINED CACHE{ALIBI_INSTALL} AND ALIBI_INSTALL)
    set(asked_install ON)
  endif()
endmacro()

# As a subproject alibi builds no tests, examples, benchmarks or docs of its own, leaves CUDA
# off unless asked (even where nvcc is installed) and adds no install rules to ours.
macro(alibi_consumer_check_subproject)
  if(TARGET alibi_tests OR TARGET alibi_bench OR TARGET alibi_docs)
    message(FATAL_ERROR "alibi built its own tests, benchmarks or docs as a subproject")
  endif()
  if(NOT asked_cuda AND (TARGET alibi::cuda OR NOT ALIBI_CUDA STREQUAL "OFF"))
    message(FATAL_ERROR "alibi enabled CUDA as a subproject without ALIBI_CUDA=ON")
  endif()
  if(NOT asked_install AND ALIBI_INSTALL)
    message(FATAL_ERROR "alibi added install rules as a subproject without ALIBI_INSTALL=ON")
  endif()
endmacro()
