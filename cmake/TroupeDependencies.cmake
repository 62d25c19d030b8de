# Finds every library troupe links. All come from Debian's packages (scripts/setup.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

# OpenBLAS (CPU sgemm). The pthread flavour: its own thread pool, sized by openblas_set_num_threads.
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)

# HDF5, C API (checkpoints). Needs C enabled in project().
find_package(HDF5 REQUIRED COMPONENTS C)

# CAF 0.17 ships no CMake package and no .pc file.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(caf::core UNKNOWN IMPORTED)
set_target_properties(caf::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR}
                      INTERFACE_LINK_LIBRARIES Threads::Threads)
add_library(caf::io UNKNOWN IMPORTED)
set_target_properties(caf::io PROPERTIES IMPORTED_LOCATION ${CAF_IO_LIBRARY}
                      INTERFACE_LINK_LIBRARIES caf::core)

pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# PCRE2 (8-bit): the Split pre-tokenizer regexes of Hugging Face tokenizer.json files.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# SentencePiece (GPTSentencePieceTokenizer, Llama2Tokenizer): the processor library only; its .pc
# also names the trainer library, which troupe does not use.
find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h REQUIRED)
find_library(SENTENCEPIECE_LIBRARY sentencepiece REQUIRED)
add_library(sentencepiece::sentencepiece UNKNOWN IMPORTED)
set_target_properties(sentencepiece::sentencepiece PROPERTIES IMPORTED_LOCATION ${SENTENCEPIECE_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${SENTENCEPIECE_INCLUDE_DIR})
# cpp-httplib (the dashboard): Debian builds it as a library; its .pc carries the defines
# (CPPHTTPLIB_OPENSSL_SUPPORT, ...) that every includer must share with it.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
if(TROUPE_BUILD_TESTS)
  find_package(Catch2 REQUIRED)
endif()
