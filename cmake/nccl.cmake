# Device collectives over NCCL (src/comm/nccl.c, nccl_stage.c; include/tandem/comm_device.h),
# included from CMakeLists.txt after the tandem library is defined. Independent of the CUDA backend
# (cmake/cuda.cmake): it needs only the CUDA runtime and NCCL, and no CUDA compiler.
#   TANDEM_NCCL=AUTO (default): built when the CUDA toolkit and NCCL are found; ON: required; OFF: never.
#   TANDEM_CUDA=OFF turns it off too. NCCL is looked for beside the toolkit (/usr/local/cuda) and
#   under NCCL_ROOT (-DNCCL_ROOT=... or the environment variable).
# Sets TANDEM_HAVE_NCCL (ON/OFF) for tests/CMakeLists.txt. Without it the sources still compile and
# every tdm_dcomm_* call returns TDM_ERR_NOT_SUPPORTED saying tandem was built without NCCL.
set(TANDEM_NCCL AUTO CACHE STRING "Build the NCCL device collectives: AUTO (when CUDA and NCCL are found), ON or OFF")
set_property(CACHE TANDEM_NCCL PROPERTY STRINGS AUTO ON OFF)
set(TANDEM_HAVE_NCCL OFF)
if(NOT TANDEM_NCCL STREQUAL "OFF" AND NOT "${TANDEM_CUDA}" STREQUAL "OFF" AND NOT TANDEM_FUZZ)
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
              PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64)
  endif()
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(TANDEM_HAVE_NCCL ON)
  elseif(TANDEM_NCCL STREQUAL "ON")
    message(FATAL_ERROR "TANDEM_NCCL=ON but the CUDA toolkit (${CUDAToolkit_FOUND}) or NCCL (nccl.h: ${NCCL_INCLUDE_DIR}, "
                        "libnccl: ${NCCL_LIBRARY}) was not found; set CUDAToolkit_ROOT / NCCL_ROOT")
  endif()
endif()

if(TANDEM_HAVE_NCCL)
  target_compile_definitions(tandem PRIVATE TANDEM_HAVE_NCCL)
  target_include_directories(tandem PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(tandem PUBLIC CUDA::cudart ${NCCL_LIBRARY})
  message(STATUS "tandem: NCCL device collectives enabled (${NCCL_LIBRARY})")
  if(NOT TANDEM_FUZZ)
    add_executable(nccl_allreduce bench/nccl_allreduce.c) # bench/nccl_allreduce.sh: NCCL vs staged all-reduce
    target_include_directories(nccl_allreduce PRIVATE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(nccl_allreduce PRIVATE tandem)
    set_target_properties(nccl_allreduce PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  endif()
else()
  message(STATUS "tandem: NCCL device collectives not built (TANDEM_NCCL=${TANDEM_NCCL}); tdm_dcomm_create says so")
endif()
