// Bindings of the nn ops (see lib/ops/).
#include "napi/addon.h"
#include "napi/dispatch.h"

namespace fa::napi {

void InitNnOps(Napi::Env env, Napi::Object exports) {
  (void)env;
  (void)exports;
}

}  // namespace fa::napi
