# Vendoring graphsafe in a C++ project, any of:
#
#   add_subdirectory(third_party/graphsafe)                  # the top-level CMakeLists.txt
#   FetchContent_Declare(graphsafe GIT_REPOSITORY ...) + FetchContent_MakeAvailable(graphsafe)
#   include(third_party/graphsafe/cmake/graphsafe.cmake)     # this file, which both of those include
#   target_link_libraries(my_engine PRIVATE graphsafe::graphsafe)
#
# Builds the C library (the graphsafe-clib member: cargo build -p graphsafe-clib) with cargo
# (Rust >= 1.85 and python3 with pip needed on the build machine; the first build provisions the
# pinned CUDA compiler and CUTLASS, see README.md; without them and offline it fails in one line)
# into this project's build tree, and exposes it as the imported target graphsafe::graphsafe with
# include/graphsafe.h on its include path. Options:
#   GRAPHSAFE_CARGO_PROFILE   release (default) or debug
#   GRAPHSAFE_CUDA_ARCHS      rows of the arch table (src/arch_table.rs) to build, e.g. "sm_90a", or a
#                             GPU's compute capability, e.g. "sm_103" (default: every row)
#   GRAPHSAFE_TARGET_DIR      cargo's target folder (default: graphsafe-cargo in the build tree)
# To install graphsafe instead (pkg-config file and a find_package(graphsafe) package), see
# cmake/install/CMakeLists.txt.
cmake_minimum_required(VERSION 3.16)
if(TARGET graphsafe::graphsafe)
  return()
endif()

find_program(GRAPHSAFE_CARGO cargo HINTS $ENV{HOME}/.cargo/bin REQUIRED)
set(GRAPHSAFE_SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." CACHE PATH "graphsafe checkout")
set(GRAPHSAFE_CARGO_PROFILE "release" CACHE STRING "cargo profile for graphsafe (release or debug)")
set(GRAPHSAFE_CUDA_ARCHS "" CACHE STRING "GPU archs to build: rows of src/arch_table.rs or compute capabilities (empty: every row)")
set(GRAPHSAFE_TARGET_DIR "${CMAKE_BINARY_DIR}/graphsafe-cargo" CACHE PATH "cargo target folder for graphsafe")
if(GRAPHSAFE_CARGO_PROFILE STREQUAL "release")
  set(_graphsafe_profile_flag "--release")
else()
  set(_graphsafe_profile_flag "")
endif()
set(GRAPHSAFE_LIBRARY "${GRAPHSAFE_TARGET_DIR}/${GRAPHSAFE_CARGO_PROFILE}/libgraphsafe.a")

file(GLOB_RECURSE _graphsafe_inputs CONFIGURE_DEPENDS
  "${GRAPHSAFE_SOURCE_DIR}/src/*.rs" "${GRAPHSAFE_SOURCE_DIR}/cuda-src/*"
  "${GRAPHSAFE_SOURCE_DIR}/include/*.h" "${GRAPHSAFE_SOURCE_DIR}/build/*.rs" "${GRAPHSAFE_SOURCE_DIR}/clib/*")
add_custom_command(
  OUTPUT "${GRAPHSAFE_LIBRARY}"
  COMMAND ${CMAKE_COMMAND} -E env CARGO_TARGET_DIR=${GRAPHSAFE_TARGET_DIR} GRAPHSAFE_CUDA_ARCHS=${GRAPHSAFE_CUDA_ARCHS}
          ${GRAPHSAFE_CARGO} build -p graphsafe-clib ${_graphsafe_profile_flag} --manifest-path ${GRAPHSAFE_SOURCE_DIR}/Cargo.toml
  DEPENDS ${_graphsafe_inputs} "${GRAPHSAFE_SOURCE_DIR}/Cargo.toml" "${GRAPHSAFE_SOURCE_DIR}/Cargo.lock" "${GRAPHSAFE_SOURCE_DIR}/build.rs"
  COMMENT "Building graphsafe (cargo build -p graphsafe-clib ${_graphsafe_profile_flag})"
  USES_TERMINAL VERBATIM)
add_custom_target(graphsafe_cargo_build DEPENDS "${GRAPHSAFE_LIBRARY}")

add_library(graphsafe_static STATIC IMPORTED GLOBAL)
set_target_properties(graphsafe_static PROPERTIES IMPORTED_LOCATION "${GRAPHSAFE_LIBRARY}")
add_dependencies(graphsafe_static graphsafe_cargo_build)

# The static library bundles the CUDA kernels and cudart_static (every runtime symbol local: a
# program's own CUDA runtime, of any version, links beside it); it needs these system libraries
# (the one list: cmake/install turns it into the pkg-config file and the CMake package too).
set(GRAPHSAFE_SYSTEM_LIBRARIES stdc++ dl rt pthread m)
add_library(graphsafe_graphsafe INTERFACE)
target_include_directories(graphsafe_graphsafe INTERFACE "${GRAPHSAFE_SOURCE_DIR}/include")
target_link_libraries(graphsafe_graphsafe INTERFACE graphsafe_static ${GRAPHSAFE_SYSTEM_LIBRARIES})
add_library(graphsafe::graphsafe ALIAS graphsafe_graphsafe)
