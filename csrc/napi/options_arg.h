// Options objects: a binding that takes one plain object of named arguments reads it through
// OptionsSnapshot, once, before it converts or checks anything else. Each property is read exactly
// once (a getter that changes its answer, or a Proxy's get trap, cannot make two reads of one key
// disagree), and the binding works from the values read from then on.
#pragma once
#include <napi.h>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "napi/addon.h"
#include "runtime/error.h"

namespace fa::napi {

// One key of an options object: its name and whether a call must give it.
struct OptionKey {
  const char* name;
  bool required;
};

// The values of an options object's keys, read once. Construction checks, in this order, with a
// TypeError naming `arg`:
// - `value` is a plain object: an object (not an Array, a function or a primitive) whose prototype
//   is Object.prototype or null (an object literal or Object.create(null));
// - each of its own enumerable string keys (Object.keys) is one of `keys`: the error names the
//   first unknown key and lists the accepted ones;
// - each required key has a value other than undefined: the error names every missing key.
// Symbol keys, non-enumerable and inherited properties are not read: they never reach the binding.
// A key absent or undefined reads as undefined.
class OptionsSnapshot {
 public:
  OptionsSnapshot(const Napi::Value& value, const char* arg, std::initializer_list<OptionKey> keys)
      : keys_(keys), values_(keys.size()) {
    Napi::Env env = value.Env();
    if (!is_plain_object(value)) {
      throw type_error(std::string("Expected ") + arg + " to be a plain object of named arguments but received " +
                       describe_non_plain(value));
    }
    const Napi::Object obj = value.As<Napi::Object>();
    napi_value names_v = nullptr;
    check(env, napi_get_all_property_names(env, obj, napi_key_own_only,
                                           static_cast<napi_key_filter>(napi_key_enumerable | napi_key_skip_symbols),
                                           napi_key_numbers_to_strings, &names_v));
    const Napi::Array names(env, names_v);
    for (uint32_t i = 0; i < names.Length(); ++i) {
      const Napi::Value name_v = names.Get(i);  // a string: the engine's own array of the keys
      const std::string name = name_v.As<Napi::String>().Utf8Value();
      const size_t index = index_of(name);
      if (index == keys_.size()) {
        std::vector<const char*> all;
        for (const OptionKey& k : keys_) all.push_back(k.name);
        throw type_error(std::string("Expected ") + arg + " to have only the keys " + quote_list(all, "or") +
                         " but received unknown key '" + name + "'");
      }
      values_[index] = obj.Get(name_v);
    }
    std::vector<const char*> missing;
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i].required && (values_[i].IsEmpty() || values_[i].IsUndefined())) missing.push_back(keys_[i].name);
    }
    if (!missing.empty()) {
      const bool one = missing.size() == 1;
      throw type_error(std::string("Expected ") + arg + " to have the required key" + (one ? " " : "s ") +
                       quote_list(missing, "and") + " but " + (one ? "it is" : "they are") + " missing");
    }
    for (Napi::Value& v : values_) {
      if (v.IsEmpty()) v = env.Undefined();
    }
  }

  // The value read for `key` (undefined where the object has none). `key` must be one of the keys
  // the snapshot was made with.
  Napi::Value operator[](const char* key) const {
    const size_t index = index_of(key);
    if (index == keys_.size()) throw std::logic_error(std::string("OptionsSnapshot: undeclared key ") + key);
    return values_[index];
  }

  // Whether `value` is a plain object: see the class comment. Object.prototype is recognised as a
  // prototype whose own prototype is null: each realm (a vm context, a Jest test environment) has its
  // own Object.prototype, and an object literal from any of them is plain.
  static bool is_plain_object(const Napi::Value& value) {
    if (value.IsEmpty() || value.Type() != napi_object || value.IsArray()) return false;
    const Napi::Value proto = prototype_of(value);  // a Proxy's getPrototypeOf trap runs here
    return proto.IsNull() || (proto.Type() == napi_object && prototype_of(proto).IsNull());
  }

 private:
  // A failed Node-API call leaves a JS exception pending (a throwing Proxy trap): rethrow it.
  static void check(Napi::Env env, napi_status status) {
    if (status != napi_ok) throw Napi::Error::New(env);
  }

  static Napi::Value prototype_of(const Napi::Value& value) {
    napi_value proto = nullptr;
    check(value.Env(), napi_get_prototype(value.Env(), value, &proto));
    return Napi::Value(value.Env(), proto);
  }

  static std::string describe_non_plain(const Napi::Value& value) {
    if (!value.IsEmpty() && value.Type() == napi_object && !value.IsArray() && !value.IsTypedArray()) {
      return "an object whose prototype is neither Object.prototype nor null";
    }
    return describe(value);
  }

  // Where `key` is in keys_ (keys_.size(): nowhere). Whole strings compare: a key with a NUL inside
  // ("q\0x") is not "q".
  size_t index_of(std::string_view key) const {
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (key == keys_[i].name) return i;
    }
    return keys_.size();
  }

  // "'a', 'b' or 'c'" (conjunction "or"), "'a' and 'b'" (conjunction "and").
  static std::string quote_list(const std::vector<const char*>& names, const char* conjunction) {
    std::string s;
    for (size_t i = 0; i < names.size(); ++i) {
      if (i > 0) s += i + 1 == names.size() ? std::string(" ") + conjunction + " " : std::string(", ");
      s += std::string("'") + names[i] + "'";
    }
    return s;
  }

  std::vector<OptionKey> keys_;
  std::vector<Napi::Value> values_;
};

}  // namespace fa::napi
