# Links with LLVM's lld where it is installed (Debian: lld; scripts/deps.sh installs it): GNU ld
# took 5.0 s to link one sanitizer-built test executable of this tree, lld 1.3 s, and CI links
# ~250 of them (ASan, TSan and fuzz builds). KVO_LINKER=default keeps the compiler's own linker.
# Only on C and C++ link lines: a CUDA target's link driver (nvcc) does not take -fuse-ld.
set(KVO_LINKER "lld" CACHE STRING "Linker: lld (when the compiler can use it) or default")
if(KVO_LINKER STREQUAL "lld")
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=lld KVO_HAVE_LLD)
  if(KVO_HAVE_LLD)
    add_link_options($<$<LINK_LANGUAGE:C,CXX>:-fuse-ld=lld>)
  else()
    message(STATUS "kvo: lld not usable by ${CMAKE_CXX_COMPILER_ID}; linking with its default linker")
  endif()
elseif(NOT KVO_LINKER STREQUAL "default")
  message(FATAL_ERROR "KVO_LINKER must be lld or default, not '${KVO_LINKER}'")
endif()
