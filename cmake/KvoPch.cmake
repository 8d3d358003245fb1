# Precompiled headers (KVO_PCH: on in the asan and tsan presets, the two trees CI builds; off
# elsewhere). Half of a sanitizer build's compile time was parsing the same standard, JSON, logging
# and GoogleTest headers in every translation unit; a precompiled header parses them once.
# A library or executable of several sources precompiles its own (compiled with its own flags, so
# it always matches them); the one-source test executables share one, built by kvo_pch_test,
# whose flags are theirs (clang refuses a PCH built with other sanitizer, PIC or macro values).
# What a PCH hides, a missing #include, the builds without it catch: clang-tidy parses every file
# without it (scripts/clang_tidy.sh removes it from the compile commands), and the release and
# debug presets (gcc) do not use it.
option(KVO_PCH "Precompiled headers for kvo's own targets (the sanitizer presets turn it on)" OFF)

# kvo_pch(<target>): the target precompiles cmake/kvo_pch.h.
function(kvo_pch target)
  if(KVO_PCH)
    target_precompile_headers(${target} PRIVATE ${KVO_SOURCE_ROOT}/cmake/kvo_pch.h)
  endif()
endfunction()

# kvo_test_pch(<target>): a test executable reuses kvo_pch_test's cmake/kvo_pch_test.h.
function(kvo_test_pch target)
  if(NOT KVO_PCH)
    return()
  endif()
  if(NOT TARGET kvo_pch_test)
    add_library(kvo_pch_test STATIC ${KVO_SOURCE_ROOT}/cmake/kvo_pch_test.cc)
    target_link_libraries(kvo_pch_test PRIVATE GTest::gtest spdlog::spdlog
                                               nlohmann_json::nlohmann_json)
    kvo_target_warnings(kvo_pch_test)
    target_precompile_headers(kvo_pch_test PRIVATE ${KVO_SOURCE_ROOT}/cmake/kvo_pch_test.h)
  endif()
  target_precompile_headers(${target} REUSE_FROM kvo_pch_test)
endfunction()
