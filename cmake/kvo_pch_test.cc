// The one source of kvo_pch_test, the target that builds the test executables' shared
// precompiled header (cmake/KvoPch.cmake).
