# node-gyp build of the addon (npm install's fallback through node-gyp-build, and prebuildify).
# The source list, the CUDA toolkit and the nvcc flags come from scripts/build-config.js, which
# CMakeLists.txt (the cmake-js developer build) reads too, so the two builds compile the same files.
{
  "variables": {
    "fa_cuda%": "<!(node scripts/build-config.js cuda)",
    "fa_cuda_home%": "<!(node scripts/build-config.js cuda-home)",
    "fa_cudart%": "<!(node scripts/build-config.js cudart)",
    "fa_nvcc%": "<!(node scripts/build-config.js nvcc)"
  },
  "targets": [
    {
      "target_name": "flash_attn_node",
      "sources": ["<!@(node scripts/build-config.js sources cpp)"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")", "csrc"],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_DEPRECATED",
        "NODE_ADDON_API_CPP_EXCEPTIONS",
        "<!@(node scripts/build-config.js defines)"
      ],
      "cflags!": ["-fno-exceptions", "-O2"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti", "-std=gnu++17", "-std=gnu++20"],
      "cflags": ["-O3", "-fvisibility=hidden"],
      "cflags_cc": ["-std=c++17", "-fexceptions"],
      "ldflags": ["-pthread"],
      "conditions": [
        ["fa_cuda==1", {
          "sources": [
            "<!@(node scripts/build-config.js sources cuda_host)",
            "<!@(node scripts/build-config.js sources cuda)"
          ],
          "include_dirs": ["<(fa_cuda_home)/include"],
          "libraries": ["<(fa_cudart)", "-ldl", "-lrt", "-lpthread"],
          "rules": [
            {
              "rule_name": "nvcc",
              "extension": "cu",
              "message": "nvcc <(RULE_INPUT_PATH)",
              "inputs": ["scripts/build-config.js", "<!@(node scripts/build-config.js headers)"],
              "outputs": ["<(INTERMEDIATE_DIR)/<(RULE_INPUT_ROOT).cu.o"],
              "action": [
                "<(fa_nvcc)",
                "<!@(node scripts/build-config.js nvcc-flags)",
                "-c", "<(RULE_INPUT_PATH)",
                "-o", "<(INTERMEDIATE_DIR)/<(RULE_INPUT_ROOT).cu.o"
              ],
              "process_outputs_as_sources": 1
            }
          ]
        }]
      ]
    }
  ]
}
