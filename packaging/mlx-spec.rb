# Homebrew formula (tap: `brew install --formula ./packaging/mlx-spec.rb`).
# Resources are generated with `brew update-python-resources mlx-spec` before a release.
class MlxSpec < Formula
  include Language::Python::Virtualenv

  desc "Local chat with lossless speculative decoding on MLX, with a live terminal UI"
  homepage "https://github.com/mlx-spec/mlx-spec"
  url "https://files.pythonhosted.org/packages/source/m/mlx-spec/mlx_spec-0.1.0.tar.gz"
  sha256 "REPLACE_AT_RELEASE"
  license "MIT"

  depends_on arch: :arm64
  depends_on macos: :sonoma # mlx wheels need macOS >= 14 on Apple silicon
  depends_on "python@3.12"

  def install
    virtualenv_install_with_resources
  end

  test do
    assert_match "lossless", shell_output("#{bin}/mlx-spec --help")
    system bin/"mlx-spec", "generate", "--prompt", "def add(", "--max-tokens", "8", "--json"
  end
end
