// Bindings of the train ops (see lib/ops/).
#include "napi/addon.h"
#include "napi/dispatch.h"

namespace fa::napi {

void InitTrainOps(Napi::Env env, Napi::Object exports) {
  (void)env;
  (void)exports;
}

}  // namespace fa::napi
