find_package(GTest REQUIRED)
include(GoogleTest)

# kvo_add_test(events/codec_test.cc LIBS kvo_events [LABELS unit]): one executable per test file.
function(kvo_add_test file)
  cmake_parse_arguments(ARG "SERIAL" "" "LIBS;LABELS" ${ARGN})
  get_filename_component(name ${file} NAME_WE)
  get_filename_component(dir ${file} DIRECTORY)
  string(REPLACE "/" "_" prefix "${dir}")
  set(target "${prefix}_${name}")
  add_executable(${target} ${CMAKE_CURRENT_SOURCE_DIR}/${file})
  target_link_libraries(${target} PRIVATE ${ARG_LIBS} kvo_testing GTest::gtest GTest::gtest_main)
  kvo_target_warnings(${target})
  kvo_test_pch(${target})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  # SERIAL: the test measures wall-clock latency or memory, so ctest -j runs nothing beside it.
  set(serial FALSE)
  if(ARG_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${target}
    WORKING_DIRECTORY ${KVO_SOURCE_ROOT}
    PROPERTIES LABELS "${ARG_LABELS}" ENVIRONMENT "KVO_SOURCE_ROOT=${KVO_SOURCE_ROOT}"
               RUN_SERIAL ${serial}
    DISCOVERY_TIMEOUT 60)
endfunction()
