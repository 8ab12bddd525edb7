import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from utils.plots import heatmap, plot_curve, plot_history, smooth  # noqa: E402


def test_smooth_is_bias_corrected_and_flat_on_constants():
    assert np.allclose(smooth([2.0] * 5), 2.0)  # no pull towards 0 at the start
    assert smooth([0, 10], weight=0.5)[-1] == 10 * 0.5 / (1 - 0.25)


def test_plot_history_labels_each_panel():
    axes = plot_history({"train_loss": [3, 2], "val_loss": [3.5, 2.5], "train_acc": [0.5, 0.7]},
                        keys=("loss", "acc"))
    assert [ax.get_ylabel() for ax in axes] == ["loss", "acc"]
    assert [line.get_label() for line in axes[0].get_lines()] == ["train", "val"]
    plt.close("all")


def test_heatmap_and_curve_have_labelled_axes():
    ax = heatmap(np.eye(3), ["a", "b", "c"], ["x", "y", "z"], xlabel="key", ylabel="query")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("key", "query")
    ax = plot_curve(np.linspace(3, 1, 50), ylabel="loss")
    assert ax.get_ylabel() == "loss" and len(ax.get_lines()) == 2
    plt.close("all")


def test_heatmap_size_is_capped_for_long_sentences():
    import matplotlib.pyplot as plt
    import numpy as np

    from utils.plots import heatmap

    ax = heatmap(np.zeros((60, 80)))
    w, h = ax.figure.get_size_inches()
    assert w <= 12 and h <= 10
    plt.close(ax.figure)
