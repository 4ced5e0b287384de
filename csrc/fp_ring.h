/* fp_ring.h: the shared-memory ring layout lives in fastpath/include/fp_ring.h, the header
 * fastpath.get_include() points C/C++ producers at; this keeps one copy and lets csrc/ and
 * the Cython modules include it by the same name. */
#include "../fastpath/include/fp_ring.h"
