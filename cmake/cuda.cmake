# The optional CUDA backend (src/cuda/, include/tandem/cuda.h), included from CMakeLists.txt after
# the tandem library is defined.
#   TANDEM_CUDA=AUTO (default): built when a CUDA compiler and the toolkit are found; ON: required;
#   OFF: never. Sets the CMake variable TANDEM_HAVE_CUDA (ON/OFF) for other parts of the build (the
#   NCCL backend keys on it), and when ON builds the static library tandem_cuda (the .cu kernels),
#   links it and cudart into tandem (cuBLAS is opened at first use) and defines TANDEM_HAVE_CUDA for tandem's C sources.
# Without a GPU the backend still builds; its tests skip (exit 77) and --device cuda names the cause.
set(TANDEM_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON (required) or OFF")
set_property(CACHE TANDEM_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TANDEM_HAVE_CUDA OFF)
if(NOT TANDEM_CUDA STREQUAL "OFF" AND NOT TANDEM_FUZZ)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc) # the toolkit's usual home, when nvcc is not on PATH
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90) # H100; -DCMAKE_CUDA_ARCHITECTURES=80;90 for others
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit QUIET)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(TANDEM_HAVE_CUDA ON)
  elseif(TANDEM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TANDEM_CUDA=ON but no CUDA compiler/toolkit was found (set CUDACXX or -DCMAKE_CUDA_COMPILER=/path/to/nvcc)")
  endif()
endif()

if(TANDEM_HAVE_CUDA)
  file(GLOB TANDEM_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.cu)
  add_library(tandem_cuda STATIC ${TANDEM_CUDA_SOURCES})
  # the C flags added by add_compile_options (-Wall, -march=native, sanitizers) are not nvcc's
  set_property(TARGET tandem_cuda PROPERTY COMPILE_OPTIONS -O3 -Xcompiler=-fPIC)
  set_target_properties(tandem_cuda PROPERTIES CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
  target_include_directories(tandem_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  # cuBLAS is opened with dlopen at first use (src/cuda/gemm.cu: linking it costs every process
  # ~1.5 s at start); the toolkit's copy is tried first, then the loader's search path
  target_link_libraries(tandem_cuda PUBLIC CUDA::cudart ${CMAKE_DL_LIBS})
  get_target_property(TANDEM_CUBLAS_LIB CUDA::cublas IMPORTED_LOCATION)
  if(TANDEM_CUBLAS_LIB)
    get_filename_component(TANDEM_CUBLAS_LIB "${TANDEM_CUBLAS_LIB}" REALPATH)
    target_compile_definitions(tandem_cuda PRIVATE TDM_CUBLAS_PATH="${TANDEM_CUBLAS_LIB}")
  endif()
  target_link_libraries(tandem PUBLIC tandem_cuda)
  # tandem was made before CUDA was enabled: give it the architectures too (it links device code)
  set_target_properties(tandem PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
  target_compile_definitions(tandem PUBLIC TANDEM_HAVE_CUDA)
  message(STATUS "tandem: CUDA backend enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "tandem: CUDA backend not built (TANDEM_CUDA=${TANDEM_CUDA}); --device cuda says so")
endif()

if(TANDEM_HAVE_CUDA AND NOT TANDEM_FUZZ)
  # the attention and AdamW kernels against their floors (bench/cuda_kernels.c)
  add_executable(cuda_kernels_bench bench/cuda_kernels.c)
  target_include_directories(cuda_kernels_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(cuda_kernels_bench PRIVATE tandem)
  set_target_properties(cuda_kernels_bench PROPERTIES OUTPUT_NAME cuda_kernels RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
endif()
