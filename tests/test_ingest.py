"""Ingest: formats, split assignment, and row-level rejections that import nothing."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from engine.domain import AUDIT, FITNESS
from engine.ingest.errors import IngestError
from engine.ingest.importer import IngestOptions, import_path, plan_import
from engine.ingest.readers import read_table, read_wrench
from engine.store.workspace import Store


def write_csv(path, rows, columns=("id", "text", "label", "split")):
    pd.DataFrame(rows, columns=list(columns)).to_csv(path, index=False)
    return path


def test_demo_imports_with_its_splits(tmp_path, demo_csv):
    store = Store.open(tmp_path / "ws")
    report = import_path(store, demo_csv)
    assert report.split_counts == {"dev": 120, "pool": 1686, "test": 250}
    assert report.labels == ("HAM", "SPAM")
    assert store.count_examples() == 2056
    # pool rows are unlabeled work: no label survives there
    assert (store.label_indices("pool") == -1).all()
    assert set(store.label_indices("dev")) == {0, 1}


def test_bad_rows_are_named_and_nothing_is_imported(tmp_path):
    path = write_csv(tmp_path / "bad.csv", [
        ("a", "fine text", "pos", "dev"),
        ("b", "", "neg", "dev"),            # empty text
        ("a", "dup id", "neg", "dev"),      # duplicate id
        ("c", "odd split", "neg", "later"),  # unknown split
        ("d", "no label on dev", "", "dev"),
    ])
    store = Store.open(tmp_path / "ws")
    with pytest.raises(IngestError) as err:
        import_path(store, path, IngestOptions(labels=("pos", "neg")))
    rows = {p.row: p.reason for p in err.value.problems}
    assert set(rows) == {2, 3, 4, 5}
    assert "empty text" in rows[2]
    assert "duplicate id 'a'" in rows[3] and "row 1" in rows[3]
    assert "unknown split 'later'" in rows[4]
    assert "needs a label" in rows[5]
    assert "nothing was imported" in str(err.value)
    assert store.count_examples() == 0


def test_label_outside_label_set_and_skip_bad_rows(tmp_path):
    path = write_csv(tmp_path / "d.csv", [
        ("1", "good one", "pos", "dev"), ("2", "good two", "neg", "dev"), ("3", "weird", "maybe", "dev"),
    ])
    with pytest.raises(IngestError, match=r"row 3: label 'maybe' is not in the label set"):
        import_path(Store.open(tmp_path / "a"), path, IngestOptions(labels=("pos", "neg")))
    store = Store.open(tmp_path / "b")
    report = import_path(store, path, IngestOptions(labels=("pos", "neg"), skip_bad_rows=True))
    assert report.n_rows == 2 and [p.row for p in report.skipped] == [3]


def test_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("id,text,label\n1,ok,a\n2,caf\xe9,b\n".encode("latin-1"))
    with pytest.raises(IngestError, match="line 3"):
        read_table(path)


def test_missing_text_column_lists_columns(tmp_path):
    path = write_csv(tmp_path / "x.csv", [("1", "hi", "a", "dev")], ("id", "body", "label", "split"))
    with pytest.raises(IngestError, match="no text column 'text'.*body"):
        import_path(Store.open(tmp_path / "ws"), path, IngestOptions(text_column="text"))


def test_a_text_column_that_is_also_the_id_label_or_split_column_is_refused(tmp_path):
    """A file with no free-text column: the studio's form fell back to its first column, the ids, and the import went
    through with annotators reading PMIDs as text."""
    frame = pd.DataFrame({"pmid": [f"{1000 + i}" for i in range(30)], "label": ["a", "b"] * 15})
    with pytest.raises(IngestError, match="text column 'pmid' is also the id column"):
        plan_import(frame, IngestOptions(text_column="pmid", id_column="pmid", label_column="label"))
    with pytest.raises(IngestError, match="text column 'label' is also the label column"):
        plan_import(frame, IngestOptions(text_column="label", id_column="pmid", label_column="label"))
    frame["abstract"] = [f"an abstract of many words about trial {i}" for i in range(30)]
    plan = plan_import(frame, IngestOptions(text_column="abstract", id_column="pmid", label_column="label"))
    assert plan.text_column == "abstract" and len(plan.rows) == 30 and not plan.problems


def _legal_rows(n_labeled: int, n_unlabeled: int) -> list[tuple[str, str, str, str]]:
    words = ["the court shall have exclusive jurisdiction", "payment is due within thirty days of invoice",
             "either party may terminate this agreement", "this agreement is governed by the laws of"]
    rows = [(f"CL-{i:04d}", f"{words[i % 4]} clause {i}", "", ("jurisdiction", "payment")[i % 2])
            for i in range(n_labeled)]
    rows += [(f"CL-U{i:04d}", f"{words[i % 4]} unlabeled {i}", "", "") for i in range(n_unlabeled)]
    return rows


def test_a_label_column_the_file_lacks_is_named_with_the_files_columns(tmp_path):
    """A header 'Label' (Excel's), or --label-column for a column the file lacks, was refused with "row 0: need at
    least two labels, found []", which named neither the column nor the file's columns."""
    path = write_csv(tmp_path / "caps.csv", [(f"r{i}", f"some words {i}", "ab"[i % 2]) for i in range(10)],
                     ("ID", "Text", "Label"))
    with pytest.raises(IngestError, match=r"^no label column 'label' in the file \(its columns: 'ID', 'Text', "
                                          r"'Label'; column names are case-sensitive: is it 'Label'\?\); name the "
                                          "column that holds the labels$"):
        import_path(Store.open(tmp_path / "a"), path)
    with pytest.raises(IngestError, match=r"^no label column 'gold' in the file \(its columns: 'ID', 'Text', "
                                          r"'Label'\); name"):
        import_path(Store.open(tmp_path / "b"), path, IngestOptions(label_column="gold"))
    assert import_path(Store.open(tmp_path / "c"), path, IngestOptions(label_column="Label")).n_rows == 10


def test_no_dev_split_says_why_when_the_rows_are_labeled(tmp_path):
    """Labeled rows that are all test (a WRENCH folder without valid.json) or a dev size of 0 were told "no labeled
    rows, so there is no dev split"."""
    folder = wrench_folder(tmp_path / "w", train=wrench_records(30), test=wrench_records(20))
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "a"), folder)
    assert [str(p) for p in err.value.problems] == [
        "the file: none of the 50 labeled rows is a dev row: by their split, 20 are test (holdout) rows and 30 pool "
        "rows, whose labels are ignored (the pool is unlabeled work); give some labeled rows the split dev (in a "
        "WRENCH folder: a valid.json), or leave their split blank to have dev drawn from them"]
    path = write_csv(tmp_path / "d.csv", [(f"r{i}", f"some words {i}", "ab"[i % 2]) for i in range(10)],
                     ("id", "text", "label"))
    plan = plan_import(read_table(path), IngestOptions(dev_size=0))  # the studio's form shows it before importing
    assert [str(p) for p in plan.problems] == [
        "the file: dev size 0: none of the 10 labeled rows goes to dev, so there is nothing to measure annotators "
        "on; ask for a dev split of at least a few rows per class"]
    with pytest.raises(IngestError, match="dev size 0: none of the 10 labeled rows"):
        import_path(Store.open(tmp_path / "b"), path, IngestOptions(dev_size=0, skip_bad_rows=True))
    unlabeled = write_csv(tmp_path / "u.csv", [(f"r{i}", f"some words {i}", "") for i in range(10)],
                          ("id", "text", "label"))
    with pytest.raises(IngestError, match="no labeled rows, so there is no dev split"):
        import_path(Store.open(tmp_path / "c"), unlabeled, IngestOptions(labels=("a", "b")))


def test_text_column_is_chosen_by_content_not_the_id(tmp_path):
    """A file with no column named text: the clause column (free text) is the text, never the id column."""
    path = write_csv(tmp_path / "clauses.csv", _legal_rows(40, 10), ("clause_id", "clause", "note", "label"))
    store = Store.open(tmp_path / "ws")
    report = import_path(store, path, IngestOptions(id_column="clause_id"))
    assert any("column 'clause'" in note for note in report.notes)
    assert store.examples_frame("dev")["text"].str.contains("clause").all()


def test_no_free_text_column_is_refused_with_the_columns(tmp_path):
    path = write_csv(tmp_path / "codes.csv", [(f"id{i}", f"c{i}", "a" if i % 2 else "b") for i in range(20)],
                     ("id", "code", "label"))
    store = Store.open(tmp_path / "ws")
    with pytest.raises(IngestError, match="no column holds free text.*code"):
        import_path(store, path)
    assert store.count_examples() == 0


def test_empty_file_is_refused_and_writes_nothing(tmp_path):
    for name, content in (("empty.csv", b""), ("blank.jsonl", b"\n\n  \n")):
        (tmp_path / name).write_bytes(content)
        store = Store.open(tmp_path / f"ws-{name}")
        with pytest.raises(IngestError, match=f"{name} is empty"):
            import_path(store, tmp_path / name)
        assert not store.has_data()


def test_ragged_csv_names_every_bad_row_and_the_good_rows_can_be_imported(tmp_path):
    lines = ["id,text,label,split"]
    for i in range(30):
        lines.append(f"{i},some words number {i},{'pos' if i % 2 else 'neg'},dev")
    lines[4] = "3,a stray, comma here,pos,dev"  # data row 4 (line 5): five cells
    lines[9] = "8,too few cells"  # data row 9: two cells
    lines[12] = "11,,neg,dev"  # data row 12: readable, but empty text (found by validation)
    path = tmp_path / "ragged.csv"
    path.write_text("\n".join(lines) + "\n")
    store = Store.open(tmp_path / "a")
    with pytest.raises(IngestError) as err:
        import_path(store, path)
    rows = {p.row: p.reason for p in err.value.problems}
    assert set(rows) == {4, 9, 12}
    assert "5 cells where the header has 4" in rows[4] and "line 5" in rows[4]
    assert "2 cells where the header has 4" in rows[9]
    assert "empty text" in rows[12]
    assert store.count_examples() == 0
    report = import_path(Store.open(tmp_path / "b"), path, IngestOptions(skip_bad_rows=True))
    assert report.n_rows == 27 and [p.row for p in report.skipped] == [4, 9, 12]


def test_a_cell_longer_than_csvs_default_limit_is_read(tmp_path, default_csv_limit):
    """A judgment of 200,000 characters refused the whole file ("field larger than field limit")."""
    judgment = "the court finds " * 12_500
    path = write_csv(tmp_path / "long.csv", [("1", judgment, "a"), ("2", "short text", "b")], ("id", "text", "label"))
    assert read_table(path)["text"].tolist() == [judgment, "short text"]


@pytest.mark.parametrize(("edits", "said"), [
    # the quote opened on line 4 takes every later line into one cell: skipping that "row" would drop the 97 rows
    # after it without a word, and its message named the last line, not the quote's
    ({3: '3,"this quote never closes,pos'}, "quote opened on line 4 .* runs to line 101"),
    # `"I love it` on line 6 and `5" tall` on line 10: the lenient parser read lines 6-10 as one row with the right
    # number of cells (row 4's text held rows 5-8, and it took row 8's label) and imported the rest without a word
    ({5: '5,"I love it who is here,neg', 9: '9,5" tall great singer,pos'},
     "quote opened on line 6 .* runs to line 10 and takes the 4 line"),
])
def test_a_quote_that_swallows_rows_refuses_the_file_at_its_line_even_when_skipping_bad_rows(tmp_path, edits, said):
    lines = ["id,text,label", *(f"{i},row {i} text here,{'pos' if i % 2 else 'neg'}" for i in range(1, 101))]
    for line, text in edits.items():
        lines[line] = text
    path = tmp_path / "swallow.csv"
    path.write_text("\n".join(lines) + "\n")
    for skip in (False, True):
        store = Store.open(tmp_path / f"ws-{skip}")
        with pytest.raises(IngestError, match=said):
            import_path(store, path, IngestOptions(skip_bad_rows=skip))
        assert store.count_examples() == 0


def test_a_tsv_cell_keeps_quotes_that_are_not_csv_quoting(tmp_path):
    """`"Hello" he said` in a TSV was stored as `Hello he said`: a tab-separated file seldom quotes. A cell quoted
    the CSV way is still read as one."""
    path = tmp_path / "quote.tsv"
    path.write_text('id\ttext\tlabel\n1\t"Hello" he said, loudly\tHAM\n2\tplain\tSPAM\n3\t"quoted\tcell"\tHAM\n'
                    '4\t5" tall\tSPAM\n')
    assert read_table(path)["text"].tolist() == ['"Hello" he said, loudly', "plain", "quoted\tcell", '5" tall']


def test_a_quoted_cell_over_several_lines_is_one_row(tmp_path):
    rows = [(str(i), f"first line {i}\nsecond \"line\", {i}", "ab"[i % 2]) for i in range(6)]
    path = write_csv(tmp_path / "multi.csv", rows, ("id", "text", "label"))  # the last row ends the file quoted
    frame = read_table(path)
    assert frame["text"].tolist() == [r[1] for r in rows]
    # a stray quote inside an unquoted cell of the last, multi-line record is no open quote (its count was odd)
    stray = tmp_path / "stray.csv"
    stray.write_text('id,text,note\n1,one,x\n2,"two\nlines",5" tall\n')
    assert read_table(stray)["note"].tolist() == ["x", '5" tall']


def test_only_labeled_rows_and_a_dev_size_beyond_them_are_explained(tmp_path):
    path = write_csv(tmp_path / "labeled.csv", _legal_rows(60, 0), ("id", "text", "note", "label"))
    report = import_path(Store.open(tmp_path / "ws"), path, IngestOptions(dev_size=500))
    assert report.split_counts.get("pool", 0) == 0
    assert any("no unlabeled rows" in note for note in report.notes)
    assert any("dev takes all 60 usable labeled rows (the dev size is 500)" in note for note in report.notes)
    # where the file's own split column puts every labeled row, the dev size asked for decides nothing: no note
    rows = [(*row[:3], row[3], "dev" if i % 2 else "test") for i, row in enumerate(_legal_rows(60, 0))]
    path = write_csv(tmp_path / "split.csv", rows, ("id", "text", "note", "label", "split"))
    report = import_path(Store.open(tmp_path / "ws2"), path, IngestOptions(dev_size=500))
    assert report.split_counts["dev"] == 30 and not any("dev takes all" in note for note in report.notes), report.notes


def test_labels_that_are_one_number_written_two_ways_are_named(tmp_path):
    """'1' and '1.0' in one label column (a spreadsheet saved some cells as floats) became two classes."""
    rows = [(f"r{i}", f"row number {i} of the file", ("0", "1")[i % 2]) for i in range(20)]
    rows[3] = ("r3", "row three", "1.0")
    path = write_csv(tmp_path / "n.csv", rows, ("id", "text", "label"))
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "a"), path)
    assert "labels '1' (9 row(s), first row 2) and '1.0' (1 row(s), first row 4) differ only in case, spacing or " \
           "number format" in str(err.value.problems[0])
    # only that form: zero-padded codes and numbers past a float's precision are labels of their own
    from engine.ingest.variants import label_key

    assert label_key("01") != label_key("1") and label_key("9007199254740993") != label_key("9007199254740992")
    assert label_key("1e3") != label_key("1000") and label_key("2.00") == label_key("2")


def test_labels_that_differ_only_in_case_or_spacing_are_named_not_split_into_classes(tmp_path):
    """'Inhibitor' beside 'inhibitor' became two classes without a word, each with part of the rows."""
    rows = [(f"r{i}", f"the drug number {i} acts here", ("inhibitor", "no relation")[i % 2]) for i in range(20)]
    rows[4] = ("r4", "the drug blocks it", "Inhibitor")
    rows[7] = ("r7", "nothing happens", "no  relation")
    path = write_csv(tmp_path / "d.csv", rows, ("id", "text", "label"))
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "a"), path, IngestOptions(skip_bad_rows=True))  # skipping cannot help
    tail = ("differ only in case, spacing or number format, so they would be 2 separate classes: write them alike "
            "in the file, or, if they are different labels, give the label set (the import form's labels box; "
            "evopool run --label NAME, one per class)")
    assert [str(p) for p in err.value.problems] == [
        f"the file: labels 'Inhibitor' (1 row(s), first row 5) and 'inhibitor' (9 row(s), first row 1) {tail}",
        f"the file: labels 'no  relation' (1 row(s), first row 8) and 'no relation' (9 row(s), first row 2) {tail}"]
    # a label set given keeps them apart, as given
    report = import_path(Store.open(tmp_path / "b"), path,
                         IngestOptions(labels=("Inhibitor", "inhibitor", "no  relation", "no relation")))
    assert report.n_rows == 20


def test_plan_import_counts_the_splits_and_writes_nothing(tmp_path):
    frame = pd.DataFrame(_legal_rows(100, 40), columns=["id", "text", "note", "label"])
    plan = plan_import(frame, IngestOptions(dev_size=60))
    assert plan.split_counts() == {"audit": 0, "dev": 60, "pool": 40, "test": 40}
    assert plan.problems == []


def test_no_split_column_draws_stratified_dev_rest_to_test(tmp_path):
    rows = [(str(i), f"text {i}", "pos" if i % 4 == 0 else "neg") for i in range(40)]
    rows += [(f"u{i}", f"unlabeled {i}", "") for i in range(10)]
    path = write_csv(tmp_path / "d.csv", rows, ("id", "text", "label"))
    store = Store.open(tmp_path / "ws")
    report = import_path(store, path, IngestOptions(dev_size=20, seed=3))
    assert report.split_counts == {"dev": 20, "pool": 10, "test": 20}
    dev = store.label_indices("dev")
    assert (dev == 1).sum() == 5  # 'pos' is a quarter of the labeled rows, and a quarter of dev
    # seeded: the same seed draws the same dev rows
    again = Store.open(tmp_path / "ws2")
    import_path(again, path, IngestOptions(dev_size=20, seed=3))
    assert again.example_ids("dev") == store.example_ids("dev")


def test_audit_rows_are_a_stratified_share_of_dev_fixed_at_import(tmp_path):
    rows = [(str(i), f"text {i}", "pos" if i % 4 == 0 else "neg", "dev") for i in range(300)]
    rows += [(f"r{i}", f"rare {i}", "rare", "dev") for i in range(8)]
    path = write_csv(tmp_path / "d.csv", rows, ("id", "text", "label", "split"))
    store = Store.open(tmp_path / "ws")
    report = import_path(store, path, IngestOptions(audit_fraction=0.2, seed=5))
    labels = dict(zip(store.example_ids("dev"), store.label_indices("dev"), strict=True))
    names = store.load_task().labels
    audit = [names[labels[i]] for i in store.example_ids(AUDIT)]
    # floor(20% of 225 neg) = 45, floor(20% of 75 pos) = 15; a class with < 10 dev rows keeps them all
    assert sorted(audit) == ["neg"] * 45 + ["pos"] * 15
    assert store.count_examples(FITNESS) == 308 - 60 and store.count_examples("dev") == 308
    assert any("held back 60" in note for note in report.notes)
    # seeded: the same seed holds back the same rows; 0 holds back none
    again = Store.open(tmp_path / "ws2")
    import_path(again, path, IngestOptions(audit_fraction=0.2, seed=5))
    assert again.example_ids(AUDIT) == store.example_ids(AUDIT)
    none = Store.open(tmp_path / "ws3")
    import_path(none, path, IngestOptions(audit_fraction=0.0))
    assert none.count_examples(AUDIT) == 0 and none.count_examples(FITNESS) == 308
    with pytest.raises(IngestError, match="audit_fraction"):
        import_path(Store.open(tmp_path / "ws4"), path, IngestOptions(audit_fraction=1.0))


def test_small_dev_holds_back_no_audit_rows(tmp_path):
    rows = [(str(i), f"text {i}", "pos" if i % 2 else "neg", "dev") for i in range(120)]
    path = write_csv(tmp_path / "d.csv", rows, ("id", "text", "label", "split"))
    store = Store.open(tmp_path / "ws")
    report = import_path(store, path, IngestOptions(audit_fraction=0.2))
    # 24 audit rows would be too few to choose an aggregator on: the agents keep all 120
    assert store.count_examples(AUDIT) == 0 and store.count_examples(FITNESS) == 120
    assert any("no audit rows" in note for note in report.notes)


def test_jsonl_keeps_extra_fields_and_reports_bad_line(tmp_path):
    good = [{"id": "r1", "text": "A binds B", "label": "bind", "split": "dev", "entity1": "A"},
            {"id": "r2", "text": "A blocks B", "label": "block", "split": "dev", "entity1": "B"}]
    path = tmp_path / "rel.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in good) + "\n")
    store = Store.open(tmp_path / "ws")
    import_path(store, path)
    assert store.load_task().fields == ("entity1",)
    assert store.examples("dev")[0].as_input() == {"entity1": "A", "text": "A binds B"}
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(good[0]) + "\n{not json\n")
    with pytest.raises(IngestError, match="row 2: not valid JSON"):
        read_table(broken)


def test_a_file_none_of_whose_rows_can_be_read_says_why_not_that_no_column_holds_text(tmp_path):
    """A JSONL written with str(dict), or a ';'-separated CSV, was refused with "no column holds free text ...; the
    columns are: ; name the text column", and every line's own problem was dropped."""
    rows = [{"id": i, "text": f"the contract ends upon notice {i}", "label": "ab"[i % 2]} for i in range(8)]
    (tmp_path / "repr.jsonl").write_text("".join(f"{r}\n" for r in rows))
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "a"), tmp_path / "repr.jsonl")
    assert str(err.value).startswith("none of the file's 8 rows could be read, so there is nothing to import; why, "
                                     "for the first 5\n  - row 1: not valid JSON (Expecting property name")
    assert [p.row for p in err.value.problems] == [1, 2, 3, 4, 5]
    (tmp_path / "semi.csv").write_text("id;text;label\n" + "".join(f"{i};the clause, number {i};a\n" for i in range(3)))
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "b"), tmp_path / "semi.csv")
    assert "(its header names 1 column(s): 'id;text;label')" in str(err.value)
    assert [str(p) for p in err.value.problems][0] == ("row 1: 2 cells where the header has 1 (line 2 of the file; a "
                                                       "stray separator or an unclosed quote?)")


def test_jsonl_rows_break_at_newlines_only(tmp_path):
    """U+2028, U+2029, \\x85 and \\x0c are legal raw inside a JSON string (ensure_ascii=False writes them so, as
    does our own JSONL export): they must not split a row; a Windows "\\r\\n" still ends one."""
    rows = [{"text": f"line{sep}break", "label": "ab"[i % 2]} for i, sep in enumerate("\u2028\u2029\x85\x0c")]
    rows.append({"text": "after them", "label": "b"})
    path = tmp_path / "d.jsonl"
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8",
                    newline="")
    frame = read_table(path)
    assert frame["text"].tolist() == [r["text"] for r in rows]
    assert frame.index.tolist() == [0, 1, 2, 3, 4]  # each row's line, as problems name it
    # an old Mac's CR-only line ends too (a raw CR is never inside a JSON string)
    raw = "\r".join(json.dumps(r, ensure_ascii=False) for r in rows).encode("utf-8")  # as the studio's upload
    assert read_table(raw, "d.jsonl")["text"].tolist() == [r["text"] for r in rows]


def test_a_lone_surrogate_is_a_bad_row_not_a_failed_file(tmp_path):
    """JSON's "\\ud800" escape parses to a lone surrogate, which no store takes: its row is named, the rest
    imports (it used to sink the whole file with an encoding error that named no row)."""
    rows = [{"text": "fine", "label": "a"}, {"text": "broken \ud800 here", "label": "b"},
            {"text": "also fine", "label": "b"}, {"text": "ok", "label": "a", "entity1": {"name": "x\udfff"}},
            {"text": "ok too", "label": "a", "café": ["\udc00"]}]  # a non-ASCII field name, named as it is
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")  # ensure_ascii: the escapes, as a file has them
    with pytest.raises(IngestError, match=r"row 2: 'text' holds a lone UTF-16 surrogate"):
        import_path(Store.open(tmp_path / "a"), path)
    report = import_path(Store.open(tmp_path / "b"), path, IngestOptions(skip_bad_rows=True))
    assert [p.row for p in report.skipped] == [2, 4, 5] and "'entity1'" in str(report.skipped[1])
    assert "'café' holds a lone UTF-16 surrogate" in str(report.skipped[2])
    assert sum(report.split_counts.values()) == 2  # the good rows are in
    folder = tmp_path / "wrench"
    folder.mkdir()
    (folder / "label.json").write_text(json.dumps({"0": "a", "1": "b"}))
    (folder / "valid.json").write_text(json.dumps({"7": {"label": 0, "data": {"text": "x \ud800"}}}))
    with pytest.raises(IngestError, match="valid.json, record 7: 'data' holds a lone UTF-16 surrogate"):
        read_wrench(folder)


def test_missing_cells_are_blank_and_integers_stay_integers(tmp_path):
    """A key missing from some JSONL rows reads as NaN, and an int column with a gap as floats: a missing id is
    an empty id (not a second id 'nan'), a missing split is drawn like a blank one (not the unknown split 'nan'),
    and the labels and ids are 1, not 1.0."""
    rows = [{"id": i, "text": f"words of row {i}", "label": i % 2, "split": "dev"} for i in range(1, 5)]
    rows += [{"id": 5, "text": "no split and no label"}, {"text": "no id here"}, {"text": "nor here"}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    plan = plan_import(read_table(path), IngestOptions(dev_size=20))
    assert [str(p) for p in plan.problems] == ["row 6: empty id", "row 7: empty id"]
    assert plan.labels == ("0", "1")
    assert plan.rows["id"].tolist() == ["1", "2", "3", "4", "5"]
    assert plan.rows.set_index("id").loc["5", "split"] == "pool"


def test_a_gap_in_a_typed_column_loses_no_digit_and_stores_no_nan(tmp_path):
    """One JSONL row without an id turned the 64-bit ids into floats (ids collapsed into 'duplicate id'), and an int
    field with a gap into 2015.0 and NaN; a NaN float64 field was stored as NaN; a Parquet string column's missing
    text was imported as the text "<NA>"."""
    rows = [{"id": 1234567890123456789 + i, "text": f"sample sentence number {i}", "label": "ab"[i % 2],
             "year": 2015} for i in range(6)]
    del rows[2]["id"], rows[4]["year"]
    path = tmp_path / "ids.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    store = Store.open(tmp_path / "a")
    report = import_path(store, path, IngestOptions(skip_bad_rows=True))
    assert [str(p) for p in report.skipped] == ["row 3: empty id"]
    fields = {e.id: e.fields for e in store.examples()}
    assert sorted(fields) == [str(1234567890123456789 + i) for i in (0, 1, 3, 4, 5)]
    assert fields["1234567890123456789"] == {"year": 2015} and fields["1234567890123456793"] == {"year": None}
    table = pd.DataFrame({"text": pd.array(["one two", None, "five six", "seven"], dtype="string"),
                          "label": ["a", "b", "a", "b"], "score": [0.5, float("nan"), 1.0, 2.0],
                          "count": pd.array([1, 2, None, 4], dtype="Int64")})
    table.to_parquet(tmp_path / "na.parquet")
    plan = plan_import(read_table(tmp_path / "na.parquet"), IngestOptions(dev_size=10))
    assert [str(p) for p in plan.problems] == ["row 2: empty text in column 'text'"]
    assert plan.rows["fields"].tolist() == [{"score": 0.5, "count": 1}, {"score": 1.0, "count": None},
                                            {"score": 2.0, "count": 4}]


def wrench_folder(path, label_json: str = '{"0": "neg", "1": "pos"}', **files: str):
    """A WRENCH folder with this label.json and these split files (train=..., valid=..., test=...)."""
    path.mkdir()
    (path / "label.json").write_text(label_json)
    for split, text in files.items():
        (path / f"{split}.json").write_text(text)
    return path


def wrench_records(n: int, blank: int | None = None) -> str:
    return json.dumps({str(i): {"data": {"text": "" if i == blank else f"text number {i}"}, "label": i % 2,
                                "weak_labels": [0]} for i in range(n)})


def test_a_wrench_row_problem_names_its_file_and_record(tmp_path):
    """Not "row 36", its place in train, valid and test put together, which no file of the folder has."""
    folder = wrench_folder(tmp_path / "w", train=wrench_records(30), valid=wrench_records(20, blank=5))
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "ws"), folder, IngestOptions(dev_size=10))
    assert [str(p) for p in err.value.problems] == ["valid.json record 5: empty text in column 'text'"]


def test_wrench_label_names_that_are_digits_stay_the_labels_they_name(tmp_path):
    """Star ratings {"0": "1", "1": "5"}: the index 1 was turned into "1" and read again as the name "1", so every
    row was filed under the first class; a label that is no index of label.json is a bad record, named."""
    records = json.loads(wrench_records(20))
    records["7"]["label"] = 2
    folder = wrench_folder(tmp_path / "w", '{"0": "1", "1": "5"}', train=wrench_records(20),
                           valid=json.dumps(records), test=wrench_records(10))
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "a"), folder)
    assert [str(p) for p in err.value.problems] == [
        "valid.json record 7: label 2 is not a label index of label.json (0 to 1)"]
    store = Store.open(tmp_path / "b")
    report = import_path(store, folder, IngestOptions(skip_bad_rows=True))
    assert report.labels == ("1", "5")
    gold = dict(zip(store.example_ids("dev"), store.label_indices("dev"), strict=True))
    assert gold == {f"valid-{i}": i % 2 for i in range(20) if i != 7}


def test_a_digit_label_is_a_name_never_an_index_into_the_label_set():
    """Stance labels -1 and 1 given as the label set: a stray 0 was read as index 0 and became -1."""
    frame = pd.DataFrame({"id": ["a", "b", "c", "d"], "label": ["-1", "1", "0", "1"],
                          "text": ["we oppose this ruling", "we support this ruling", "the court adjourned",
                                   "strong support for the appeal"]})
    plan = plan_import(frame, IngestOptions(labels=("-1", "1"), dev_size=10))
    assert [str(p) for p in plan.problems] == ["row 3: label '0' is not in the label set (-1, 1)"]
    assert [plan.labels[i] for i in plan.rows["label"]] == ["-1", "1", "1"]


@pytest.mark.parametrize(("label_json", "files", "message"), [
    ("{not json", {}, "label.json is not valid JSON"),
    ('["neg", "pos"]', {}, "label.json must be a JSON object"),
    ('{"0": "neg", "2": "pos"}', {}, "label.json must name the labels 0 to 1; it has no '1'"),
    ('{"0": "neg", "1": "pos"}', {"test": '[{"data": {"text": "x y"}, "label": 0}]'},
     "test.json must be a JSON object of records by id.*not a list"),
    ('{"0": "neg", "1": "pos"}', {"valid": '{"3": "text"}'}, "valid.json, record 3: a record must be a JSON object"),
    ('{"0": "neg", "1": "pos"}', {"valid": '{"3": {"data": "text"}}'},
     "valid.json, record 3: its data must be a JSON object"),
])
def test_a_malformed_wrench_folder_is_an_ingest_error_naming_the_file(tmp_path, label_json, files, message):
    """These crashed the CLI with a KeyError or an AttributeError traceback."""
    folder = wrench_folder(tmp_path / "w", label_json, **{"train": wrench_records(4), **files})
    with pytest.raises(IngestError, match=message):
        import_path(Store.open(tmp_path / "ws"), folder)


def test_parquet_round_trip(tmp_path):
    frame = pd.DataFrame({"text": ["one", "two", "three", "four"], "label": ["a", "b", "a", "b"],
                          "split": ["dev", "dev", "pool", "test"]})
    frame.to_parquet(tmp_path / "d.parquet")
    store = Store.open(tmp_path / "ws")
    report = import_path(store, tmp_path / "d.parquet")
    assert report.split_counts == {"dev": 2, "pool": 1, "test": 1}


def test_a_parquet_index_is_data_or_nothing_never_the_row_number(tmp_path):
    """`df.set_index("pmid").to_parquet(...)` restores the PMIDs as the index, which was taken for the row number:
    each row was stored under PMID+1 and its problems named rows the file does not have; a filtered frame's
    unnamed index (0, 2, 3, ...) named the wrong row."""
    frame = pd.DataFrame({"pmid": [31000000, 31000017, 31000342, 31000999],
                          "text": ["aspirin inhibits cox", "no interaction here", "", "drug blocks the receptor"],
                          "label": ["inhibitor", "none", "none", "inhibitor"]})
    frame.set_index("pmid").to_parquet(tmp_path / "pmid.parquet")
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "a"), tmp_path / "pmid.parquet", IngestOptions(id_column="pmid"))
    assert [str(p) for p in err.value.problems] == ["row 3: empty text in column 'text'"]
    store = Store.open(tmp_path / "b")
    import_path(store, tmp_path / "pmid.parquet", IngestOptions(id_column="pmid", skip_bad_rows=True))
    assert sorted(store.example_ids()) == ["31000000", "31000017", "31000999"]
    frame.drop(columns="pmid").iloc[[0, 2, 3]].to_parquet(tmp_path / "filtered.parquet")  # index 0, 2, 3
    with pytest.raises(IngestError) as err:
        import_path(Store.open(tmp_path / "c"), tmp_path / "filtered.parquet")
    assert [str(p) for p in err.value.problems] == ["row 2: empty text in column 'text'"]
    # a caller's own frame: its index is no row of any file either
    plan = plan_import(frame.set_index("pmid"), IngestOptions(labels=("inhibitor", "none"), dev_size=10))
    assert [str(p) for p in plan.problems] == ["row 3: empty text in column 'text'"]
    assert plan.rows["id"].tolist() == ["1", "2", "4"]


def test_second_import_into_same_workspace_is_refused(tmp_path, demo_csv):
    store = Store.open(tmp_path / "ws")
    import_path(store, demo_csv)
    with pytest.raises(IngestError, match="already holds data"):
        import_path(store, demo_csv)
    assert store.count_examples() == 2056


@pytest.mark.parametrize("write", ["save_task", "set_meta", "add_examples"])
def test_an_import_cut_short_at_any_write_can_be_run_again(tmp_path, demo_csv, monkeypatch, write):
    """Ctrl-C between the import's writes: the rows had landed before the task, so the workspace held data (a
    second import was refused) and no task (every command failed on it)."""
    store = Store.open(tmp_path / "ws")

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Store, write, cut)
        with pytest.raises(KeyboardInterrupt):
            import_path(store, demo_csv)
    report = import_path(store, demo_csv)
    assert store.count_examples() == 2056 and store.load_task().labels == report.labels == ("HAM", "SPAM")


def test_wrench_folder_hides_weak_labels_and_caps_dev(tmp_path, shared_data):
    store = Store.open(tmp_path / "ws")
    report = import_path(store, shared_data / "youtube", IngestOptions(dev_size=100))
    assert report.split_counts == {"dev": 100, "pool": 1686 + 20, "test": 250}
    example = store.examples("dev")[0]
    assert "weak_labels" not in example.fields and "weak_labels" not in example.as_input()
    assert "label" not in example.as_input()


def test_a_file_with_a_header_and_no_rows_says_so(tmp_path):
    """A CSV with its header and nothing under it (blank lines at most) is refused as that, with its columns named;
    the studio's preview (plan_import) says the same."""
    path = tmp_path / "header_only.csv"
    path.write_text("text,label\n\n\n")
    store = Store.open(tmp_path / "ws")
    with pytest.raises(IngestError, match=r"header_only.csv: the file has no rows under its header \(columns: "
                                          r"text, label\)"):
        import_path(store, path, IngestOptions())
    assert not store.has_data()
    with pytest.raises(IngestError, match="no rows under its header"):
        plan_import(pd.read_csv(path), IngestOptions())
