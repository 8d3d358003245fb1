# Finds what the Python extension needs: Python 3 (interpreter + development files for extension
# modules) and pybind11 (Debian: python3-dev, pybind11-dev). Sets KVO_PYTHON when both are there;
# otherwise the package is skipped with a message. The interpreter defaults to Debian's
# /usr/bin/python3 when it exists (pass -DPython3_EXECUTABLE=... for another one, e.g. a venv's
# Python 3.12 with torch).
if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3)
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
if(Python3_FOUND)
  # pybind11's config from Debian's pybind11-dev, or from the interpreter's pybind11 package.
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir())"
                    OUTPUT_VARIABLE _kvo_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_kvo_pybind11_dir)
      find_package(pybind11 CONFIG QUIET PATHS ${_kvo_pybind11_dir} NO_DEFAULT_PATH)
    endif()
  endif()
endif()
if(Python3_FOUND AND pybind11_FOUND)
  set(KVO_PYTHON ON)
  message(STATUS "kvo: Python extension for ${Python3_EXECUTABLE} (${Python3_VERSION}), pybind11 ${pybind11_VERSION}")
else()
  message(STATUS "kvo: Python 3 development files or pybind11 not found; python/ is not built")
endif()
