# Warnings are errors on our own targets only (third-party headers come in as SYSTEM), and only
# when KVO_WERROR is on: our presets and CI turn it on; a user's own build type (e.g. a plain
# -DCMAKE_BUILD_TYPE=Release with a newer or older compiler) does not fail on a new warning.
function(kvo_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor)
  if(KVO_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  else()
    # GCC 12 reports false maybe-uninitialized positives inside std::variant/std::optional moves
    # at -O2 (seen in release and TSan builds of the codec tests); keep them warnings, not errors.
    target_compile_options(${target} PRIVATE -Wno-error=maybe-uninitialized)
  endif()
endfunction()

# kvo_library(NAME folder DEPS ...): a static library of every .cc in the folder. Its public headers
# are the folder's headers except `*_internal.h` and those under `internal/`; another module including
# one of those fails scripts/check_includes.sh (CI; the rule is written there).
function(kvo_library name)
  cmake_parse_arguments(ARG "" "" "PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${KVO_SOURCE_ROOT})
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  kvo_target_warnings(${name})
  list(LENGTH srcs n_srcs)
  if(n_srcs GREATER 2)  # one or two sources: a precompiled header of its own would not pay
    kvo_pch(${name})
  endif()
endfunction()
