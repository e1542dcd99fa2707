// Checkpoint reading (checkpoint/): safetensors files as untrusted input (every malformed header is
// refused with the file and the tensor named), model folders (index, single file, shards), and the
// packing of one layer's experts for a rank: gate/up rows into w13, down into w2, the rank's slice
// of the intermediate size and its local experts, fp8 block scales, the correction bias.
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/expert_tensors.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "temp_dir.h"

namespace moejit::checkpoint {
namespace {

using nlohmann::json;
using testing_support::TempDir;

// Runs `f`, which must throw InvalidInput, and checks that the message contains every part.
template <typename F>
void expect_invalid(F&& f, std::initializer_list<std::string> parts) {
  std::string message;
  try {
    f();
    ADD_FAILURE() << "no InvalidInput thrown; expected one mentioning " << *parts.begin();
    return;
  } catch (const InvalidInput& e) {
    message = e.what();
  }
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

// A file of a claimed header length, header text and data bytes, as a writer (or an attacker) made it.
std::string raw_file(uint64_t claimed_header_bytes, const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(claimed_header_bytes >> (8 * i));
  return bytes + header + std::string(data_bytes, '\x01');
}
std::string raw_file(const std::string& header, size_t data_bytes) { return raw_file(header.size(), header, data_bytes); }

TEST(Safetensors, ReadsWhatItWrites) {
  TempDir dir;
  const std::vector<uint16_t> a = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {0.5f, -2.0f};
  const std::string path = dir.path() + "/x.safetensors";
  write_safetensors(path, {{"a", "BF16", {2, 3}, a.data(), 12}, {"b", "F32", {2}, b.data(), 8}, {"empty", "F32", {0, 4}, nullptr, 0}});
  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), 3u);
  const TensorInfo* ta = f->find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(describe(*ta), "[2, 3] BF16");
  EXPECT_EQ(std::memcmp(f->data(*ta), a.data(), 12), 0);
  const TensorInfo* tb = f->find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(std::memcmp(f->data(*tb), b.data(), 8), 0);
  EXPECT_EQ(f->find("c"), nullptr);
  // The header is padded to 8 bytes.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  expect_invalid([&] { write_safetensors(path, {{"a", "BF16", {2, 3}, a.data(), 10}}); }, {"'a'", "10 bytes", "[2, 3]"});
  expect_invalid([&] { write_safetensors(path, {{"a", "BF16", {-2, -3}, a.data(), 12}}); }, {"'a'", "[-2, -3]"});
}

TEST(Safetensors, MalformedFilesAreRefusedNamingFileAndTensor) {
  TempDir dir;
  auto file = [&](const std::string& bytes) { return dir.write("t.safetensors", bytes); };
  const std::string ok_entry = R"("w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]})";
  struct Case {
    std::string bytes;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"short", {"too short"}},
      {raw_file(uint64_t{1} << 40, "{}", 0), {"header claims", "at most"}},
      {raw_file(64, "{}", 0), {"header claims 64 bytes", "truncated"}},
      {raw_file("{not json", 0), {"not valid JSON"}},
      {raw_file("[1, 2]", 0), {"not a JSON object"}},
      {raw_file(R"({"w": {"dtype": "F32", "shape": [[[[[1]]]]], "data_offsets": [0, 4]}})", 4), {"nests deeper"}},
      {raw_file("{" + ok_entry + "}", 8), {"'w'", "reach past the file's 8 data bytes"}},
      {raw_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8), {"'w'", "takes 12 bytes", "hold 8"}},
      {raw_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8),
       {"'w'", "more than 2^64"}},
      {raw_file(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8), {"'w'", "non-negative"}},
      {raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8), {"'w'", "end before they begin"}},
      {raw_file(R"({"w": {"dtype": "F32", "shape": [2]}})", 8), {"'w'", "no \"data_offsets\""}},
      {raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                12),
       {"overlap"}},
      {raw_file(R"({"__metadata__": {"format": 1}})", 0), {"__metadata__", "not a string"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.parts.front());
    const std::string path = file(c.bytes);
    std::string message;
    try {
      SafetensorsFile::open(path);
    } catch (const InvalidInput& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const auto& part : c.parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
  // Not a regular file.
  expect_invalid([&] { SafetensorsFile::open(dir.path()); }, {dir.path(), "not a regular file"});
  ::mkfifo((dir.path() + "/fifo").c_str(), 0600);
  expect_invalid([&] { SafetensorsFile::open(dir.path() + "/fifo"); }, {"not a regular file"});
  expect_invalid([&] { SafetensorsFile::open(dir.path() + "/missing"); }, {"cannot open"});
  // A dtype moejit does not know opens (its range is still checked): it is refused where it is read.
  auto unknown = SafetensorsFile::open(file(raw_file(R"({"s": {"dtype": "F8_E8M0", "shape": [4], "data_offsets": [0, 4]}})", 4)));
  EXPECT_EQ(unknown->find("s")->dtype, "F8_E8M0");
  expect_invalid([&] { SafetensorsFile::open(file(raw_file(R"({"s": {"dtype": "F4", "shape": [4], "data_offsets": [0, 9]}})", 4))); },
                 {"'s'", "reach past"});
  // A zero size makes no elements, wherever it stands among huge ones.
  EXPECT_NO_THROW(SafetensorsFile::open(file(raw_file(R"({"z": {"dtype": "F32", "shape": [1099511627776, 1099511627776, 0], "data_offsets": [0, 0]}})", 0))));
  // Metadata of strings is fine.
  EXPECT_NO_THROW(SafetensorsFile::open(file(raw_file(R"({"__metadata__": {"format": "pt"}, )" + ok_entry + "}", 16))));
}

// Random damage to a valid file's header and length: every variant opens or is refused with
// InvalidInput, and what opens reads only inside the file (the tensors' ranges were checked).
TEST(Safetensors, DamagedHeadersNeverCrash) {
  TempDir dir;
  const std::vector<float> a(6, 1.0f), b(3, 2.0f);
  const std::string good_path = dir.path() + "/good.safetensors";
  write_safetensors(good_path, {{"model.layers.0.mlp.experts.0.up_proj.weight", "F32", {2, 3}, a.data(), 24},
                                {"b", "F32", {3}, b.data(), 12}});
  std::ifstream in(good_path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, good.data(), 8);
  std::mt19937 rng(20261203);
  int opened = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (8 + header_bytes);  // the length or the header
      switch (rng() % 3) {
        case 0: bytes[at] = static_cast<char>(rng()); break;                      // a random byte
        case 1: bytes[at] = "0123456789[]{},:\"-e"[rng() % 20]; break;           // JSON-ish
        default: bytes.resize(std::max<size_t>(8, bytes.size() - rng() % 16)); break;  // truncated
      }
    }
    const std::string path = dir.write("damaged.safetensors", bytes);
    try {
      auto f = SafetensorsFile::open(path);
      ++opened;
      for (const auto& t : f->tensors()) {
        ASSERT_LE(t.end, bytes.size());
        unsigned sum = 0;
        for (uint64_t k = 0; k < t.bytes(); ++k) sum += f->data(t)[k];  // inside the mapping
        [[maybe_unused]] volatile unsigned keep = sum;
      }
    } catch (const InvalidInput&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(opened, 0);  // some edits (inside a name, say) leave a valid file
}

TEST(Checkpoint, ReadsAnIndexASingleFileOrShards) {
  const float one = 1.0f, two = 2.0f;
  {
    TempDir dir;
    write_safetensors(dir.path() + "/model-00001-of-00002.safetensors", {{"a", "F32", {1}, &one, 4}});
    write_safetensors(dir.path() + "/model-00002-of-00002.safetensors", {{"b", "F32", {1}, &two, 4}});
    dir.write("model.safetensors.index.json",
              json{{"metadata", {{"total_size", 8}}},
                   {"weight_map", {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}}
                  .dump());
    const Checkpoint c = Checkpoint::open(dir.path());
    EXPECT_EQ(c.files().size(), 2u);
    EXPECT_EQ(c.names(), (std::vector<std::string>{"a", "b"}));
    const FoundTensor b = c.find("b");
    ASSERT_NE(b.info, nullptr);
    float value;
    std::memcpy(&value, b.file->data(*b.info), 4);
    EXPECT_EQ(value, 2.0f);
    EXPECT_EQ(c.find("c").info, nullptr);
  }
  {
    TempDir dir;  // no index: every *.safetensors file
    write_safetensors(dir.path() + "/x.safetensors", {{"a", "F32", {1}, &one, 4}});
    write_safetensors(dir.path() + "/y.safetensors", {{"b", "F32", {1}, &two, 4}});
    EXPECT_EQ(Checkpoint::open(dir.path()).names(), (std::vector<std::string>{"a", "b"}));
    write_safetensors(dir.path() + "/z.safetensors", {{"a", "F32", {1}, &two, 4}});
    expect_invalid([&] { Checkpoint::open(dir.path()); }, {"tensor 'a' is in both", "x.safetensors", "z.safetensors"});
  }
}

TEST(Checkpoint, BadIndexesAndFoldersAreRefused) {
  TempDir dir;
  const float one = 1.0f;
  expect_invalid([&] { Checkpoint::open(dir.path() + "/nope"); }, {"not a folder"});
  expect_invalid([&] { Checkpoint::open(dir.path()); }, {"no checkpoint found", "model.safetensors.index.json"});
  write_safetensors(dir.path() + "/m.safetensors", {{"a", "F32", {1}, &one, 4}});
  auto index = [&](const json& weight_map) { dir.write("model.safetensors.index.json", json{{"weight_map", weight_map}}.dump()); };
  index({{"a", "../m.safetensors"}});
  expect_invalid([&] { Checkpoint::open(dir.path()); }, {"'../m.safetensors'", "plain file names"});
  index({{"b", "m.safetensors"}});
  expect_invalid([&] { Checkpoint::open(dir.path()); }, {"tensor 'b'", "'m.safetensors'", "does not hold it"});
  index({{"a", "gone.safetensors"}});
  expect_invalid([&] { Checkpoint::open(dir.path()); }, {"'gone.safetensors' is missing"});
  index({{"a", 3}});
  expect_invalid([&] { Checkpoint::open(dir.path()); }, {"non-string"});
  dir.write("model.safetensors.index.json", "{\"weight_map\": [");
  expect_invalid([&] { Checkpoint::open(dir.path()); }, {"not valid JSON"});
}

// A checkpoint of one MoE layer with per-expert tensors whose every element tells where it came
// from: value = 1000 * expert + 100 * projection + row... (as fp32 for exact checks).
struct LayerCheckpoint {
  int64_t E = 4, H = 4, I = 6;
  std::vector<std::vector<float>> storage;  // kept alive for write_safetensors
  std::vector<TensorToWrite> tensors;

  static float value(int e, int projection, int64_t row, int64_t col) {
    return static_cast<float>(e * 10000 + projection * 1000 + row * 10 + col);
  }
  void add(const std::string& name, std::vector<int64_t> shape, std::vector<float> v, const std::string& dtype = "F32") {
    storage.push_back(std::move(v));
    tensors.push_back({name, dtype, std::move(shape), storage.back().data(), storage.back().size() * 4});
  }
  void add_expert(const std::string& prefix, const std::string& projection_name, int e, int projection, int64_t rows, int64_t cols) {
    std::vector<float> v;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v.push_back(value(e, projection, r, c));
    add(prefix + ".experts." + std::to_string(e) + "." + projection_name + ".weight", {rows, cols}, std::move(v));
  }
  void write(const std::string& path) {
    storage.reserve(1000);
    write_safetensors(path, tensors);
  }
};

MoeConfig fp32_config(int64_t E, int64_t H, int64_t I) {
  MoeConfig c;
  c.experts = static_cast<int>(E);
  c.topk = 2;
  c.hidden = H;
  c.moe_intermediate = I;
  c.dtype = c.router_dtype = DType::FP32;
  return c;
}

float at(const HostTensor& t, int64_t i) {
  float f;
  std::memcpy(&f, t.bytes.data() + i * 4, 4);
  return f;
}

TEST(ExpertTensors, PacksGateUpDownForARank) {
  TempDir dir;
  LayerCheckpoint l;
  l.storage.reserve(64);
  const std::string prefix = "model.layers.3.mlp";
  for (int e = 0; e < l.E; ++e) {
    l.add_expert(prefix, "gate_proj", e, 0, l.I, l.H);
    l.add_expert(prefix, "up_proj", e, 1, l.I, l.H);
    l.add_expert(prefix, "down_proj", e, 2, l.H, l.I);
  }
  l.add(prefix + ".gate.weight", {l.E, l.H}, std::vector<float>(l.E * l.H, 0.0f));
  l.write(dir.path() + "/model.safetensors");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  const auto layers = find_moe_layers(ckpt);
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].layer, 3);
  EXPECT_EQ(layers[0].naming, ExpertNaming::PerExpert);
  EXPECT_EQ(layers[0].experts, (std::vector<int>{0, 1, 2, 3}));

  MoeConfig c = fp32_config(l.E, l.H, l.I);
  c.ep_size = 2, c.ep_rank = 1, c.tp_size = 2, c.tp_rank = 1;  // experts 2, 3; intermediate rows 3..5
  const ExpertWeights w = load_experts(ckpt, c, layers[0]);
  const int64_t I_loc = 3;
  ASSERT_EQ(w.w13.shape, (std::vector<int64_t>{2, 2 * I_loc, l.H}));
  ASSERT_EQ(w.w2.shape, (std::vector<int64_t>{2, l.H, I_loc}));
  for (int el = 0; el < 2; ++el)
    for (int64_t r = 0; r < 2 * I_loc; ++r)
      for (int64_t k = 0; k < l.H; ++k) {
        const int projection = r < I_loc ? 0 : 1;  // gate rows, then up rows
        ASSERT_EQ(at(w.w13, (el * 2 * I_loc + r) * l.H + k), LayerCheckpoint::value(2 + el, projection, 3 + r % I_loc, k))
            << el << " " << r << " " << k;
      }
  for (int el = 0; el < 2; ++el)
    for (int64_t h = 0; h < l.H; ++h)
      for (int64_t i = 0; i < I_loc; ++i)
        ASSERT_EQ(at(w.w2, (el * l.H + h) * I_loc + i), LayerCheckpoint::value(2 + el, 2, h, 3 + i));
  EXPECT_FALSE(w.w13_scale || w.w2_scale || w.correction_bias);

  // What is missing or wrong is named with its file; the config's sizes are said.
  MoeConfig bf16 = c;
  bf16.dtype = bf16.router_dtype = DType::BF16;
  expect_invalid([&] { load_experts(ckpt, bf16, layers[0]); },
                 {"layer 3", "model.layers.3.mlp.experts.2.gate_proj.weight", "[6, 4] F32", "must be [6, 4] BF16", "model.safetensors"});
  MoeConfig more = fp32_config(8, l.H, l.I);
  expect_invalid([&] { load_experts(ckpt, more, layers[0]); }, {"'model.layers.3.mlp.experts.4.gate_proj.weight' missing"});
  MoeConfig wider = fp32_config(l.E, l.H, 8);
  expect_invalid([&] { load_experts(ckpt, wider, layers[0]); }, {"[6, 4] F32", "must be [8, 4]", "moe_intermediate 8"});
  MoeConfig noaux = c;
  noaux.topk_method = TopkMethod::NoauxTc;
  expect_invalid([&] { load_experts(ckpt, noaux, layers[0]); }, {"e_score_correction_bias", "missing"});
  MoeConfig int8 = c;
  int8.quant = Quant::W8A8Int8;
  expect_invalid([&] { load_experts(ckpt, int8, layers[0]); }, {"w8a8_int8", "no smoothquant checkpoint format"});
}

TEST(ExpertTensors, MixtralAndFusedNamesAndTheCorrectionBias) {
  TempDir dir;
  LayerCheckpoint l;
  l.storage.reserve(64);
  for (int e = 0; e < l.E; ++e) {
    l.add_expert("model.layers.0.block_sparse_moe", "w1", e, 0, l.I, l.H);
    l.add_expert("model.layers.0.block_sparse_moe", "w3", e, 1, l.I, l.H);
    l.add_expert("model.layers.0.block_sparse_moe", "w2", e, 2, l.H, l.I);
  }
  // Layer 1 fused as transformers 5.x holds it: gate_up_proj [E, 2I, H], down_proj [E, H, I].
  std::vector<float> gate_up, down;
  for (int e = 0; e < l.E; ++e) {
    for (int projection : {0, 1})
      for (int64_t r = 0; r < l.I; ++r)
        for (int64_t k = 0; k < l.H; ++k) gate_up.push_back(LayerCheckpoint::value(e, projection, r, k));
    for (int64_t h = 0; h < l.H; ++h)
      for (int64_t i = 0; i < l.I; ++i) down.push_back(LayerCheckpoint::value(e, 2, h, i));
  }
  l.add("model.layers.1.mlp.experts.gate_up_proj", {l.E, 2 * l.I, l.H}, gate_up);
  l.add("model.layers.1.mlp.experts.down_proj", {l.E, l.H, l.I}, down);
  // A bf16 correction bias (DeepSeek's is fp32; some exports keep the model dtype): 1.5 and -0.25 are exact.
  const std::vector<uint16_t> bias = {0x3FC0, 0xBE80, 0x0000, 0x3F80};
  l.tensors.push_back({"model.layers.1.mlp.gate.e_score_correction_bias", "BF16", {l.E}, bias.data(), 8});
  l.write(dir.path() + "/model.safetensors");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  const auto layers = find_moe_layers(ckpt);
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].naming, ExpertNaming::Mixtral);
  EXPECT_EQ(layers[1].naming, ExpertNaming::Fused);

  MoeConfig c = fp32_config(l.E, l.H, l.I);
  c.tp_size = 3, c.tp_rank = 2;  // intermediate rows 4, 5
  const ExpertWeights mixtral = load_experts(ckpt, c, layers[0]);
  c.topk_method = TopkMethod::NoauxTc;
  c.scoring = Scoring::Sigmoid;
  const ExpertWeights fused = load_experts(ckpt, c, layers[1]);
  EXPECT_EQ(mixtral.w13.bytes, fused.w13.bytes);  // both pack the same values
  EXPECT_EQ(mixtral.w2.bytes, fused.w2.bytes);
  EXPECT_EQ(at(fused.w13, 0), LayerCheckpoint::value(0, 0, 4, 0));
  EXPECT_EQ(at(fused.w13, 2 * l.H), LayerCheckpoint::value(0, 1, 4, 0));  // the up rows after the 2 gate rows
  ASSERT_TRUE(fused.correction_bias);
  EXPECT_EQ(at(*fused.correction_bias, 0), 1.5f);
  EXPECT_EQ(at(*fused.correction_bias, 1), -0.25f);
  EXPECT_EQ(at(*fused.correction_bias, 3), 1.0f);
}

// An fp16 correction bias converts exactly, subnormals and infinities included.
TEST(ExpertTensors, Fp16CorrectionBias) {
  TempDir dir;
  LayerCheckpoint l;
  l.E = 4;
  for (int e = 0; e < l.E; ++e) {
    l.add_expert("model.layers.0.mlp", "gate_proj", e, 0, l.I, l.H);
    l.add_expert("model.layers.0.mlp", "up_proj", e, 1, l.I, l.H);
    l.add_expert("model.layers.0.mlp", "down_proj", e, 2, l.H, l.I);
  }
  const std::vector<uint16_t> bias = {0x3E00, 0xB400, 0x0001, 0x7C00};  // 1.5, -0.25, 2^-24, inf
  l.tensors.push_back({"model.layers.0.mlp.gate.e_score_correction_bias", "F16", {l.E}, bias.data(), 8});
  l.write(dir.path() + "/model.safetensors");
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  MoeConfig c = fp32_config(l.E, l.H, l.I);
  c.topk_method = TopkMethod::NoauxTc;
  const ExpertWeights w = load_experts(ckpt, c, find_moe_layers(ckpt)[0]);
  ASSERT_TRUE(w.correction_bias);
  EXPECT_EQ(at(*w.correction_bias, 0), 1.5f);
  EXPECT_EQ(at(*w.correction_bias, 1), -0.25f);
  EXPECT_EQ(at(*w.correction_bias, 2), 0x1p-24f);
  EXPECT_EQ(at(*w.correction_bias, 3), std::numeric_limits<float>::infinity());
}

// DeepSeek-V3's format: e4m3 weights, fp32 scales per 128 x 128 block beside each as *_scale_inv.
TEST(ExpertTensors, Fp8BlockScalesFollowTheRanksSlice) {
  TempDir dir;
  const int64_t E = 2, H = 256, I = 384;  // 2 x 3 scale blocks for gate/up, 3 x 2 for down
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<std::vector<float>> scales;
  bytes.reserve(16), scales.reserve(16);
  std::vector<TensorToWrite> tensors;
  auto weight = [&](const std::string& name, int64_t rows, int64_t cols, int tag) {
    std::vector<unsigned char> b(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) b[r * cols + k] = static_cast<unsigned char>((tag * 31 + r * 7 + k) & 0x7f);
    bytes.push_back(std::move(b));
    tensors.push_back({name, "F8_E4M3", {rows, cols}, bytes.back().data(), bytes.back().size()});
    std::vector<float> s;
    for (int64_t r = 0; r < (rows + 127) / 128; ++r)
      for (int64_t k = 0; k < (cols + 127) / 128; ++k) s.push_back(static_cast<float>(tag * 100 + r * 10 + k));
    scales.push_back(std::move(s));
    tensors.push_back({name + "_scale_inv", "F32", {(rows + 127) / 128, (cols + 127) / 128}, scales.back().data(),
                       scales.back().size() * 4});
  };
  for (int e = 0; e < E; ++e) {
    const std::string p = "model.layers.5.mlp.experts." + std::to_string(e);
    weight(p + ".gate_proj.weight", I, H, e * 3 + 0);
    weight(p + ".up_proj.weight", I, H, e * 3 + 1);
    weight(p + ".down_proj.weight", H, I, e * 3 + 2);
  }
  write_safetensors(dir.path() + "/model.safetensors", tensors);
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  const auto layers = find_moe_layers(ckpt);
  ASSERT_EQ(layers.size(), 1u);
  MoeConfig c = fp32_config(E, H, I);
  c.dtype = c.router_dtype = DType::BF16;
  c.quant = Quant::Fp8Block;
  c.tp_size = 3, c.tp_rank = 1;  // I_loc = 128: intermediate rows 128..255, block 1
  const ExpertWeights w = load_experts(ckpt, c, layers[0]);
  ASSERT_EQ(w.w13.dtype, "F8_E4M3");
  ASSERT_TRUE(w.w13_scale && w.w2_scale);
  ASSERT_EQ(w.w13_scale->shape, (std::vector<int64_t>{E, 2, 2}));  // [E_loc, 2 I_loc / 128, H / 128]
  ASSERT_EQ(w.w2_scale->shape, (std::vector<int64_t>{E, 2, 1}));   // [E_loc, H / 128, I_loc / 128]
  for (int e = 0; e < E; ++e) {
    for (int half = 0; half < 2; ++half)
      for (int k = 0; k < 2; ++k)  // gate's (then up's) row block 1
        EXPECT_EQ(at(*w.w13_scale, (e * 2 + half) * 2 + k), static_cast<float>((e * 3 + half) * 100 + 1 * 10 + k));
    for (int h = 0; h < 2; ++h)  // down's column block 1
      EXPECT_EQ(at(*w.w2_scale, e * 2 + h), static_cast<float>((e * 3 + 2) * 100 + h * 10 + 1));
    // w13 row 0 of expert e is gate row 128; row 128 is up row 128; w2 row h starts at column 128.
    EXPECT_EQ(w.w13.bytes[e * 256 * H + 5], bytes[e * 3 + 0][128 * H + 5]);
    EXPECT_EQ(w.w13.bytes[(e * 256 + 128) * H + 5], bytes[e * 3 + 1][128 * H + 5]);
    EXPECT_EQ(w.w2.bytes[(e * H + 7) * 128 + 3], bytes[e * 3 + 2][7 * I + 128 + 3]);
  }
  // A rank's slice that splits a scale block cannot keep the checkpoint's scales.
  c.tp_size = 2, c.tp_rank = 0;  // I_loc = 192
  expect_invalid([&] { load_experts(ckpt, c, layers[0]); }, {"fp8_block", "moe_intermediate / tp_size = 192", "multiple of 128"});
  // fp8_tensor wants per-tensor scales.
  c.tp_size = 1, c.tp_rank = 0;
  c.quant = Quant::Fp8Tensor;
  expect_invalid([&] { load_experts(ckpt, c, layers[0]); }, {"gate_proj.weight_scale_inv", "is [3, 2] F32", "must be [] or [1] F32"});
}

TEST(ExpertTensors, TwoBlocksUnderOneLayerIndexAreRefused) {
  TempDir dir;
  const float one = 1.0f;
  write_safetensors(dir.path() + "/model.safetensors",
                    {{"model.vision.layers.2.mlp.experts.0.up_proj.weight", "F32", {1}, &one, 4},
                     {"model.text.layers.2.mlp.experts.0.up_proj.weight", "F32", {1}, &one, 4}});
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  expect_invalid([&] { find_moe_layers(ckpt); }, {"two MoE blocks have layer index 2", "model.text.layers.2.mlp",
                                                  "model.vision.layers.2.mlp"});
}

// transformers 5.x fused fp8: gate_up_proj [E, 2I, H] with gate_up_proj_scale_inv [E, 2I/128, H/128].
TEST(ExpertTensors, FusedFp8BlockScalesFollowTheRanksSlice) {
  TempDir dir;
  const int64_t E = 2, H = 128, I = 256;
  std::vector<unsigned char> gate_up(static_cast<size_t>(E * 2 * I * H)), down(static_cast<size_t>(E * H * I));
  for (size_t i = 0; i < gate_up.size(); ++i) gate_up[i] = static_cast<unsigned char>(i * 7 % 127);
  for (size_t i = 0; i < down.size(); ++i) down[i] = static_cast<unsigned char>(i * 5 % 127);
  std::vector<float> gate_up_scale, down_scale;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < 4; ++r) gate_up_scale.push_back(static_cast<float>(e * 100 + r));   // [E, 4, 1]
  for (int64_t e = 0; e < E; ++e)
    for (int64_t c = 0; c < 2; ++c) down_scale.push_back(static_cast<float>(e * 100 + 50 + c));  // [E, 1, 2]
  const std::string p = "model.layers.0.mlp.experts.";
  write_safetensors(dir.path() + "/model.safetensors",
                    {{p + "gate_up_proj", "F8_E4M3", {E, 2 * I, H}, gate_up.data(), gate_up.size()},
                     {p + "gate_up_proj_scale_inv", "F32", {E, 4, 1}, gate_up_scale.data(), gate_up_scale.size() * 4},
                     {p + "down_proj", "F8_E4M3", {E, H, I}, down.data(), down.size()},
                     {p + "down_proj_scale_inv", "F32", {E, 1, 2}, down_scale.data(), down_scale.size() * 4}});
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  MoeConfig c = fp32_config(E, H, I);
  c.dtype = c.router_dtype = DType::BF16;
  c.quant = Quant::Fp8Block;
  c.tp_size = 2, c.tp_rank = 1;  // I_loc = 128: gate rows 128..255 (block 1), up rows 384..511 (block 3)
  const ExpertWeights w = load_experts(ckpt, c, find_moe_layers(ckpt)[0]);
  ASSERT_EQ(w.w13_scale->shape, (std::vector<int64_t>{E, 2, 1}));
  ASSERT_EQ(w.w2_scale->shape, (std::vector<int64_t>{E, 1, 1}));
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(at(*w.w13_scale, e * 2), static_cast<float>(e * 100 + 1));
    EXPECT_EQ(at(*w.w13_scale, e * 2 + 1), static_cast<float>(e * 100 + 3));
    EXPECT_EQ(at(*w.w2_scale, e), static_cast<float>(e * 100 + 51));
    EXPECT_EQ(w.w13.bytes[(e * 256 + 0) * H + 3], gate_up[(e * 2 * I + 128) * H + 3]);
    EXPECT_EQ(w.w13.bytes[(e * 256 + 128) * H + 3], gate_up[(e * 2 * I + I + 128) * H + 3]);
    EXPECT_EQ(w.w2.bytes[(e * H + 5) * 128 + 2], down[(e * H + 5) * I + 128 + 2]);
  }
}

TEST(ExpertTensors, Fp8TensorGateAndUpMustShareTheirScale) {
  TempDir dir;
  const int64_t H = 16, I = 16;
  std::vector<unsigned char> w(static_cast<size_t>(H * I), 0x38);  // 1.0 in e4m3
  const float one = 1.0f, two = 2.0f;
  const std::string p = "model.layers.0.mlp.experts.0.";
  write_safetensors(dir.path() + "/model.safetensors",
                    {{p + "gate_proj.weight", "F8_E4M3", {I, H}, w.data(), w.size()},
                     {p + "gate_proj.weight_scale_inv", "F32", {}, &one, 4},
                     {p + "up_proj.weight", "F8_E4M3", {I, H}, w.data(), w.size()},
                     {p + "up_proj.weight_scale_inv", "F32", {1}, &two, 4},
                     {p + "down_proj.weight", "F8_E4M3", {H, I}, w.data(), w.size()},
                     {p + "down_proj.weight_scale_inv", "F32", {1}, &two, 4}});
  const Checkpoint ckpt = Checkpoint::open(dir.path());
  MoeConfig c = fp32_config(1, H, I);
  c.topk = 1;
  c.dtype = c.router_dtype = DType::BF16;
  c.quant = Quant::Fp8Tensor;
  expect_invalid([&] { load_experts(ckpt, c, find_moe_layers(ckpt)[0]); }, {"expert 0's gate and up per-tensor fp8 scales differ", "1 and 2"});
}

}  // namespace
}  // namespace moejit::checkpoint
