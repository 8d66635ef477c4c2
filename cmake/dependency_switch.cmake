# The switch of an optional dependency (MPI, SentencePiece, CUDA): the cache variable `name` takes AUTO (use the
# dependency when it is found), ON (require it: the caller fails the configuration when it is missing) or OFF
# (never look); any other value stops the configuration here, naming it. `have` (the caller's "found and used"
# flag) starts OFF; the caller's find step turns it on.
function(mixtrain_dependency_switch name have doc)
  set(${name} AUTO CACHE STRING "${doc}: AUTO, ON or OFF")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  if(NOT ${name} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${name} must be AUTO, ON or OFF, got '${${name}}'")
  endif()
  set(${have} OFF PARENT_SCOPE)
endfunction()
