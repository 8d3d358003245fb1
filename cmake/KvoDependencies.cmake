# Every dependency is a Debian package found through its CMake config (see README).
find_package(Threads REQUIRED)
find_package(cppzmq REQUIRED)          # cppzmq-dev + libzmq3-dev
find_package(msgpack-cxx CONFIG QUIET)
if(NOT msgpack-cxx_FOUND)
  find_package(msgpackc-cxx CONFIG REQUIRED NAMES msgpackc-cxx msgpack)  # libmsgpack-cxx-dev
endif()
find_package(spdlog REQUIRED)          # libspdlog-dev
find_package(CLI11 REQUIRED)           # libcli11-dev
find_package(nlohmann_json REQUIRED)   # nlohmann-json3-dev
find_package(OpenSSL REQUIRED)         # libssl-dev (SHA-256)
find_package(SQLite3 REQUIRED)         # libsqlite3-dev
find_package(Boost 1.74 REQUIRED)      # libboost-dev: Asio + Beast (header-only), the HTTP server

if(TARGET msgpack-cxx)
  set(KVO_MSGPACK msgpack-cxx)
else()
  set(KVO_MSGPACK msgpackc-cxx)
endif()

# xxHash (libxxhash-dev) ships no CMake config: journal record checksums use XXH3-64.
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
add_library(kvo_xxhash INTERFACE)
target_include_directories(kvo_xxhash SYSTEM INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(kvo_xxhash INTERFACE ${XXHASH_LIBRARY})

# cpp-httplib (libcpp-httplib-dev): Debian ships it compiled (libcpp-httplib.so); its pkg-config
# file carries the feature defines the library was built with, which every includer must match.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CPPHTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
add_library(kvo_httplib INTERFACE)
target_link_libraries(kvo_httplib INTERFACE PkgConfig::CPPHTTPLIB)
