"""The diagnosis behind `make conformance`: which recipe an implementation computes (identification),
what it handles (capabilities), what each failure is caused by (classify, ablation, effects), and the
report that lists each defect once (report, recorder)."""
