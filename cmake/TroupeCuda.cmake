# CUDA detection. TROUPE_CUDA=auto builds the CUDA backend when nvcc, cuBLAS and NCCL are all found;
# on requires them; off skips them. Sets TROUPE_HAVE_CUDA and defines TROUPE_WITH_CUDA=1 on
# troupe_cuda_flags for code that must know.
set(TROUPE_HAVE_CUDA OFF)
string(TOLOWER "${TROUPE_CUDA}" _troupe_cuda)
if(NOT _troupe_cuda MATCHES "^(auto|on|off)$")
  message(FATAL_ERROR "TROUPE_CUDA must be auto, on or off (got '${TROUPE_CUDA}')")
endif()

if(NOT _troupe_cuda STREQUAL "off")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/local/cuda/lib)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cublas AND NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
    set(TROUPE_HAVE_CUDA ON)
  elseif(_troupe_cuda STREQUAL "on")
    message(FATAL_ERROR "TROUPE_CUDA=on but the CUDA toolkit is incomplete: nvcc='${CMAKE_CUDA_COMPILER}' "
                        "cuBLAS=${CUDAToolkit_FOUND} NCCL='${NCCL_LIBRARY}'. Install CUDA, cuBLAS and NCCL "
                        "under /usr/local/cuda or configure with -DTROUPE_CUDA=off.")
  endif()
endif()

add_library(troupe_cuda_flags INTERFACE)
if(TROUPE_HAVE_CUDA)
  enable_language(CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  # One CUDA runtime per process: the shared one, which CUDA::cudart and NCCL also use.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  add_library(nccl::nccl UNKNOWN IMPORTED)
  set_target_properties(nccl::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  target_compile_definitions(troupe_cuda_flags INTERFACE TROUPE_WITH_CUDA=1)
  message(STATUS "troupe: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, NCCL ${NCCL_LIBRARY})")
else()
  message(STATUS "troupe: CUDA backend OFF (TROUPE_CUDA=${TROUPE_CUDA})")
endif()
