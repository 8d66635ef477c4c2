#include "mixtrain/data/csv.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <iterator>

#include "mixtrain/core/input_budget.h"
#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;
using testing::FedFifo;
using testing::TempDir;
using testing::write_text;

// Writes text to a fresh file and returns the error load_csv throws for it, checking it names the file.
Error csv_error(const TempDir& dir, const std::string& name, const std::string& text, const CsvOptions& options = {}) {
  const std::string path = dir.file(name);
  write_text(path, text);
  Error e = error_of([&] { load_csv(path, options); });
  EXPECT_TRUE(contains(e.what(), "'" + path + "'")) << e.what();
  return e;
}

TEST(Csv, ParsesCrlfWhitespaceAndTrailingBlankLines) {
  TempDir dir;
  const std::string path = dir.file("iris.csv");
  write_text(path, "a, b ,label\r\n1,2,0\r\n 3.5 , -4e1 , 2 \r\n\r\n+0.25,1e-3,1.0\r\n\r\n\n  \n");
  const Dataset d = load_csv(path);
  EXPECT_EQ(d.x.shape(), (Shape{3, 2}));
  EXPECT_EQ(d.x.dtype(), DType::kFloat32);
  EXPECT_EQ(d.x.to_floats(), (std::vector<float>{1.0f, 2.0f, 3.5f, -40.0f, 0.25f, 0.001f}));
  EXPECT_EQ(d.y.dtype(), DType::kInt32);
  EXPECT_EQ(d.y.to_ints(), (std::vector<int32_t>{0, 2, 1}));
  EXPECT_EQ(d.num_classes, 3);
  EXPECT_EQ(d.sample_shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(d.source, path);
}

TEST(Csv, ByteOrderMarkAndQuotedCells) {
  TempDir dir;
  const std::string path = dir.file("quoted.csv");
  write_text(path, "\xEF\xBB\xBF\"f 1\",\"f,2\",\"y\"\n\"1.5\",2,\"4\"\n0,\"-7\",0");
  const Dataset d = load_csv(path);
  EXPECT_EQ(d.x.to_floats(), (std::vector<float>{1.5f, 2.0f, 0.0f, -7.0f}));
  EXPECT_EQ(d.y.to_ints(), (std::vector<int32_t>{4, 0}));
  EXPECT_EQ(d.num_classes, 5);
  // The quoted comma belongs to the column name, which errors then quote.
  const Error e = csv_error(dir, "q2.csv", "\"f,1\",y\nabc,0\n");
  EXPECT_TRUE(contains(e.what(), "line 2, column 1 'f,1': 'abc' is not a number")) << e.what();
}

TEST(Csv, NonNumericCellNamesLineColumnAndText) {
  TempDir dir;
  const Error e = csv_error(dir, "bad.csv", "a,b,label\n1,2,0\n\n1,x7,1\n");
  EXPECT_TRUE(contains(e.what(), "line 4, column 2 'b': 'x7' is not a number")) << e.what();
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
  const Error empty_cell = csv_error(dir, "hole.csv", "a,b,label\n1,,0\n");
  EXPECT_TRUE(contains(empty_cell.what(), "line 2, column 2 'b': '' is not a number")) << empty_cell.what();
  const Error nan = csv_error(dir, "nan.csv", "a,label\nnan,0\n");
  EXPECT_TRUE(contains(nan.what(), "line 2, column 1 'a': 'nan' is not a finite float32 number")) << nan.what();
  const Error huge = csv_error(dir, "huge.csv", "a,label\n1,0\n1e39,0\n");
  EXPECT_TRUE(contains(huge.what(), "line 3, column 1 'a': '1e39' is not a finite float32 number")) << huge.what();
}

TEST(Csv, RaggedRowsGiveLineNumber) {
  TempDir dir;
  const Error short_row = csv_error(dir, "short.csv", "a,b,label\r\n1,2,0\r\n1,2\r\n");
  EXPECT_TRUE(contains(short_row.what(), "line 3 has 2 cells but the header has 3 columns")) << short_row.what();
  const Error long_row = csv_error(dir, "long.csv", "a,b,label\n1,2,3,0\n");
  EXPECT_TRUE(contains(long_row.what(), "line 2 has 4 cells but the header has 3 columns")) << long_row.what();
}

TEST(Csv, BadLabels) {
  TempDir dir;
  const Error frac = csv_error(dir, "frac.csv", "a,label\n1,0\n2,0.5\n");
  EXPECT_TRUE(contains(frac.what(), "line 3, column 2 'label': '0.5' is not an integer")) << frac.what();
  EXPECT_TRUE(contains(frac.hint(), "integer class ids")) << frac.hint();
  const Error neg = csv_error(dir, "neg.csv", "a,label\n1,-1\n");
  EXPECT_TRUE(contains(neg.what(), "line 2, column 2 'label': '-1' is negative")) << neg.what();
  const Error name = csv_error(dir, "name.csv", "a,species\n1,setosa\n");
  EXPECT_TRUE(contains(name.what(), "line 2, column 2 'species': 'setosa' is not a number")) << name.what();
  const Error big = csv_error(dir, "big.csv", "a,label\n1,65536\n");
  EXPECT_TRUE(contains(big.what(), "'65536' is too large")) << big.what();
  // The largest id allowed still loads.
  write_text(dir.file("max.csv"), "a,label\n1,65535\n");
  EXPECT_EQ(load_csv(dir.file("max.csv")).num_classes, 65536);
}

TEST(Csv, EmptyHeaderOnlyAndHeaderless) {
  TempDir dir;
  EXPECT_TRUE(contains(csv_error(dir, "empty.csv", "").what(), "is empty"));
  EXPECT_TRUE(contains(csv_error(dir, "blank.csv", "\r\n \n\t\n").what(), "is empty"));
  const Error header_only = csv_error(dir, "header.csv", "a,b,label\r\n\r\n");
  EXPECT_TRUE(contains(header_only.what(), "has a header but no data rows")) << header_only.what();
  const Error headerless = csv_error(dir, "numbers.csv", "1,2,0\n3,4,1\n", {.header = CsvHeader::kYes});
  EXPECT_TRUE(contains(headerless.what(), "line 1 holds numbers where the header row")) << headerless.what();
  const Error one_column = csv_error(dir, "one.csv", "label\n0\n");
  EXPECT_TRUE(contains(one_column.what(), "line 1: the header has 1 column")) << one_column.what();
  const Error quote = csv_error(dir, "quote.csv", "a,label\n\"1,0\n");
  EXPECT_TRUE(contains(quote.what(), "line 2: a quoted cell is not closed")) << quote.what();
}

TEST(Csv, MissingFileIsAnIoError) {
  TempDir dir;
  const Error e = error_of([&] { load_csv(dir.file("absent.csv")); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_TRUE(contains(e.what(), "CSV file '" + dir.file("absent.csv") + "' does not exist")) << e.what();
}

// Only regular files are data: a FIFO would block the open (here it is fed valid rows, so a reader that opened it
// would succeed), /dev/zero would be read without end (/dev/null stands for it here), a directory holds nothing.
TEST(Csv, RefusesFifosDevicesAndDirectories) {
  TempDir dir;
  const std::string fifo = dir.file("fifo.csv");
  FedFifo feeder(fifo, "a,label\n1,0\n2,1\n");
  Error e = error_of([&] { load_csv(fifo); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_TRUE(contains(e.what(), "CSV file '" + fifo + "' is a FIFO (named pipe), not a regular file")) << e.what();

  const std::string device = dir.file("zero.csv");
  std::filesystem::create_symlink("/dev/null", device);
  e = error_of([&] { load_csv(device); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_TRUE(contains(e.what(), "CSV file '" + device + "' is a character device, not a regular file")) << e.what();

  e = error_of([&] { load_csv(dir.path().string()); });
  EXPECT_TRUE(contains(e.what(), "is a directory, not a regular file")) << e.what();
}

TEST(Csv, SplitsHoldOutATestPart) {
  TempDir dir;
  std::string text = "x,label\n";
  for (int i = 0; i < 10; ++i) text += std::to_string(i) + "," + std::to_string(i % 2) + "\n";
  write_text(dir.file("ten.csv"), text);
  const DataSplits s = load_csv_splits(dir.file("ten.csv"), 0.2, 3);
  EXPECT_FALSE(s.test_from_files);
  EXPECT_EQ(s.train.size(), 8);
  EXPECT_EQ(s.test.size(), 2);
  EXPECT_EQ(s.train.num_classes, 2);
  EXPECT_EQ(s.test.num_classes, 2);
  std::vector<float> all = s.train.x.to_floats();
  const std::vector<float> test = s.test.x.to_floats();
  all.insert(all.end(), test.begin(), test.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  for (int64_t r = 0; r < s.test.size(); ++r)
    EXPECT_EQ(s.test.y.at(r), static_cast<float>(static_cast<int>(s.test.x.at(r)) % 2));
}

// header=auto|yes|no: public CSVs usually have no header row; auto reads both layouts.
TEST(Csv, HeaderAutoYesNo) {
  TempDir dir;
  const std::string plain = dir.file("plain.csv");
  write_text(plain, "1,2,0\n3,4,1\n5,6,1\n");
  for (CsvHeader h : {CsvHeader::kAuto, CsvHeader::kNo}) {
    const Dataset d = load_csv(plain, {.header = h});
    EXPECT_EQ(d.x.to_floats(), (std::vector<float>{1, 2, 3, 4, 5, 6}));  // the first row is a sample
    EXPECT_EQ(d.y.to_ints(), (std::vector<int32_t>{0, 1, 1}));
  }
  const std::string named = dir.file("named.csv");
  write_text(named, "x1,x2,y\n1,2,0\n");
  EXPECT_EQ(load_csv(named).x.shape(), (Shape{1, 2}));
  EXPECT_EQ(load_csv(named, {.header = CsvHeader::kYes}).x.shape(), (Shape{1, 2}));
  // header=no on a file with a header: the names are cells that are not numbers.
  const Error e = error_of([&] { load_csv(named, {.header = CsvHeader::kNo}); });
  EXPECT_TRUE(contains(e.what(), "line 1, column 1: 'x1' is not a number")) << e.what();
  // Without a header, a short row names the first row's width.
  const Error short_row = csv_error(dir, "short.csv", "1,2,0\n3,1\n");
  EXPECT_TRUE(contains(short_row.what(), "line 2 has 2 cells but the first row has 3 cells")) << short_row.what();
  EXPECT_EQ(parse_csv_header("no"), CsvHeader::kNo);
  EXPECT_THROW(parse_csv_header("maybe"), Error);
}

TEST(Csv, LabelColumnByNameOrIndex) {
  TempDir dir;
  const std::string path = dir.file("first.csv");
  write_text(path, "species,len,width\n2,1.5,0.5\n0,2.5,0.25\n");
  for (const CsvOptions& o : {CsvOptions{.label_column = "species"}, CsvOptions{.label_index = 0},
                              CsvOptions{.label_index = -3}}) {
    const Dataset d = load_csv(path, o);
    EXPECT_EQ(d.y.to_ints(), (std::vector<int32_t>{2, 0}));
    EXPECT_EQ(d.x.to_floats(), (std::vector<float>{1.5f, 0.5f, 2.5f, 0.25f}));  // the others, in file order
    EXPECT_EQ(d.sample_shape, (std::vector<int64_t>{2}));
  }
  const Error unknown = csv_error(dir, "u.csv", "a,b\n1,0\n", {.label_column = "label"});
  EXPECT_TRUE(contains(unknown.what(), "no column is named 'label'; the header names a, b")) << unknown.what();
  const Error nameless = csv_error(dir, "n.csv", "1,0\n", {.label_column = "label"});
  EXPECT_TRUE(contains(nameless.what(), "has no header row")) << nameless.what();
  const Error outside = csv_error(dir, "o.csv", "a,b\n1,0\n", {.label_index = 2});
  EXPECT_TRUE(contains(outside.what(), "label column index 2 is outside the 2 columns")) << outside.what();
  // A bad label names the chosen column.
  const Error bad = csv_error(dir, "b.csv", "y,x\n0.5,1\n", {.label_column = "y"});
  EXPECT_TRUE(contains(bad.what(), "column 1 'y': '0.5' is not an integer")) << bad.what();
}

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

TEST(Csv, GzipCompressedFilesReadTransparently) {
  TempDir dir;
  std::string text = "a,b,label\n";
  for (int i = 0; i < 5000; ++i) text += std::to_string(i) + "," + std::to_string(-i) + "," + std::to_string(i % 3) + "\n";
  const std::string gz = dir.file("big.csv.gz");
  write_gzip(gz, text);
  const Dataset d = load_csv(gz);
  EXPECT_EQ(d.x.shape(), (Shape{5000, 2}));
  EXPECT_EQ(d.x.to_floats()[2 * 4999 + 1], -4999.0f);
  EXPECT_EQ(d.y.to_ints()[4999], 4999 % 3);
  // The name does not matter: the magic bytes do.
  const std::string disguised = dir.file("data.csv");
  write_gzip(disguised, "1,2,1\n");
  EXPECT_EQ(load_csv(disguised).y.to_ints(), (std::vector<int32_t>{1}));
  // A truncated gzip stream is reported as such, not as a wrong cell count.
  std::string bytes;
  {
    std::ifstream in(gz, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const Error e = csv_error(dir, "cut.csv.gz", bytes.substr(0, bytes.size() / 2));
  EXPECT_TRUE(contains(e.what(), "cannot decompress its gzip data")) << e.what();
}

// Sets the input budget for one test and restores the default after it.
struct BudgetOf {
  explicit BudgetOf(int64_t bytes) { set_input_budget(bytes); }
  ~BudgetOf() { set_input_budget(0); }
};

// A gzip of far more text than the budget (the issue's: a few MB inflating to 2 GB of valid rows, which ran out of
// memory suggesting a smaller --batch-size) is refused as its text arrives, naming the file and the budget.
TEST(Csv, AGzipExpandingPastTheInputBudgetIsRefusedAsItArrives) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 400000; ++i) text += "1.0,2.0,0\n";  // 4 MB of rows, a few KB compressed
  const std::string gz = dir.file("rows.csv.gz");
  write_gzip(gz, text);
  {
    const BudgetOf budget(1 << 20);
    const Error e = error_of([&] { load_csv(gz); });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_TRUE(contains(e.what(), "'" + gz + "': its text (decompressed) would take ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "more than the input budget of 1.0 MiB")) << e.what();
  }
  EXPECT_EQ(load_csv(gz).x.shape(), (Shape{400000, 2}));  // under the default budget it loads
}

// One line of many cells (the issue's: 20 million cells in a 39 KB gzip) is refused before it is split into cells,
// and rows x columns past the budget before they are stored.
TEST(Csv, ALineOrRowsPastTheInputBudgetAreRefusedBeforeTheyAreStored) {
  TempDir dir;
  std::string wide;
  for (int i = 0; i < 100000; ++i) wide += "0,";
  wide += "0\n";  // 200 KB of text, 100,001 cells
  const BudgetOf budget(1 << 20);
  const Error line = csv_error(dir, "wide.csv", wide);
  EXPECT_TRUE(contains(line.what(), "line 1's 100001 cells would take 3.4 MiB in memory")) << line.what();
  std::string rows;
  for (int i = 0; i < 40000; ++i) rows += "1,2,3,0\n";  // 320 KB of text, 1.2 MB of float32 rows twice
  const Error many = csv_error(dir, "rows.csv", rows);
  EXPECT_TRUE(contains(many.what(), "its text and ")) << many.what();
  EXPECT_TRUE(contains(many.what(), " rows of 4 columns would take ")) << many.what();
}

}  // namespace
}  // namespace mixtrain
