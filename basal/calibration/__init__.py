"""Calibrating and evaluating a served model on the user's own labelled requests (docs/calibration.md).

`labelled` reads and checks a labelled file, `collect` runs it through the serving decision path, `fit` fits a
temperature per question type, `certify` certifies `max_error` thresholds, `calibrate` writes
CALIBRATION.custom.json, `metrics` and `report` evaluate a calibration."""
