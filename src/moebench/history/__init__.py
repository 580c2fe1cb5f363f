"""The history: many runs read together. A nightly history, change points and the ones a person
accepted, runs side by side, and the A/A repeat of a selection. It returns numbers and records;
moebench.outputs draws and words them."""
