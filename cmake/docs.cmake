# alibi_docs: the API reference (HTML) from the /// comments of include/alibi, by Doxygen.
# Included from the top-level CMakeLists.txt when doxygen is found.
#
# Warnings are errors (WARN_AS_ERROR=FAIL_ON_WARNINGS: Doxygen lists every warning, then
# fails), but undocumented entities are not warned about: the reference documents what has a
# comment. The detail namespaces and the CUDA kernel headers
# (include/alibi/backend/cuda) are internals and are left out; alibi::backend::cuda, the tag
# a user passes, is declared in core/backends.hpp and stays in.
set(DOXYGEN_PROJECT_NAME alibi)
set(DOXYGEN_PROJECT_NUMBER ${PROJECT_VERSION})
set(DOXYGEN_PROJECT_BRIEF "${PROJECT_DESCRIPTION}")
set(DOXYGEN_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/docs)
set(DOXYGEN_GENERATE_HTML YES)
set(DOXYGEN_GENERATE_LATEX NO)
set(DOXYGEN_WARN_AS_ERROR FAIL_ON_WARNINGS)
set(DOXYGEN_WARN_IF_UNDOCUMENTED NO)
set(DOXYGEN_WARN_IF_DOC_ERROR YES)
set(DOXYGEN_WARN_NO_PARAMDOC NO)
set(DOXYGEN_QUIET YES)
set(DOXYGEN_RECURSIVE YES)
set(DOXYGEN_FILE_PATTERNS *.hpp *.cuh *.dox)
set(DOXYGEN_EXTENSION_MAPPING cuh=C++)
set(DOXYGEN_EXCLUDE ${PROJECT_SOURCE_DIR}/include/alibi/backend/cuda)
set(DOXYGEN_EXCLUDE_SYMBOLS detail "*::detail" "*::detail::*")
set(DOXYGEN_STRIP_FROM_PATH ${PROJECT_SOURCE_DIR}/include)
set(DOXYGEN_STRIP_FROM_INC_PATH ${PROJECT_SOURCE_DIR}/include)
set(DOXYGEN_FULL_PATH_NAMES YES)
set(DOXYGEN_EXTRACT_ALL NO)
set(DOXYGEN_JAVADOC_AUTOBRIEF YES)
set(DOXYGEN_SORT_MEMBER_DOCS NO)
set(DOXYGEN_HAVE_DOT NO)
set(DOXYGEN_GENERATE_TREEVIEW YES)
# Preprocess as a host compiler would see the headers, with the annotation macros empty.
set(DOXYGEN_ENABLE_PREPROCESSING YES)
set(DOXYGEN_MACRO_EXPANSION YES)
set(DOXYGEN_EXPAND_ONLY_PREDEF YES)
set(DOXYGEN_PREDEFINED "ALIBI_HOST_DEVICE=" "ALIBI_DEVICE=" "ALIBI_FORCEINLINE=inline")
doxygen_add_docs(alibi_docs ${PROJECT_SOURCE_DIR}/include/alibi ${PROJECT_SOURCE_DIR}/docs/api
  COMMENT "alibi: API reference (Doxygen) into ${PROJECT_BINARY_DIR}/docs/html")
