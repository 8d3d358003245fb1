# Applies KVO_SANITIZE to everything built in this tree (our code and tests).
if(KVO_SANITIZE)
  string(REPLACE ";" "," _kvo_san "${KVO_SANITIZE}")
  add_compile_options(-fsanitize=${_kvo_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_kvo_san})
  # clang links its ASan runtime statically by default, gcc links libasan.so: with clang, link the
  # shared runtime too (found through an rpath), so a kvo process started from a Python test,
  # whose interpreter preloads that runtime (kvo_asan_preload), runs one ASan runtime, not two.
  if("address" IN_LIST KVO_SANITIZE AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} --print-runtime-dir
                    OUTPUT_VARIABLE _kvo_rt_dir OUTPUT_STRIP_TRAILING_WHITESPACE)
    add_link_options(-shared-libasan "LINKER:-rpath,${_kvo_rt_dir}")
  endif()
endif()

# kvo_asan_preload(<var>): what an uninstrumented interpreter must LD_PRELOAD to load an ASan
# module (python/): the compiler's shared ASan runtime (gcc's libasan, clang's libclang_rt.asan,
# which also holds UBSan's handlers), then libstdc++ (ASan's __cxa_throw interceptor resolves the
# real one at start-up; without it the first C++ exception aborts). Space-separated.
function(kvo_asan_preload out)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(_runtime "libclang_rt.asan-${CMAKE_SYSTEM_PROCESSOR}.so")
  else()
    set(_runtime "libasan.so")
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${_runtime}
                  OUTPUT_VARIABLE _asan OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE _stdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_asan}" OR NOT EXISTS "${_asan}")
    message(FATAL_ERROR "kvo: no shared ASan runtime (${_runtime}) for ${CMAKE_CXX_COMPILER}; "
                        "Debian: the libclang-rt-dev package of this clang")
  endif()
  set(${out} "${_asan} ${_stdcxx}" PARENT_SCOPE)
endfunction()
