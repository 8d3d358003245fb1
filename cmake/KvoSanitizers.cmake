# Applies KVO_SANITIZE to everything built in this tree (our code and tests).
if(KVO_SANITIZE)
  string(REPLACE ";" "," _kvo_san "${KVO_SANITIZE}")
  add_compile_options(-fsanitize=${_kvo_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_kvo_san})
endif()
