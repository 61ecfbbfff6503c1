// Must NOT compile: the policies in another order than Model, Optimizer, Precision, Communicator,
// Backend, Loss (a communicator where the precision goes). The first error must name the policy.
#include <xtrain/xtrain.hpp>

int main() {
  using Model = xtrain::layers::Sequential<xtrain::layers::Linear>;
  xtrain::Trainer<Model, xtrain::optim::Adam, xtrain::parallel::SingleProcess, xtrain::FullPrecision> trainer{
      Model{xtrain::layers::Linear{4, 2}}, xtrain::optim::Adam{}};
  (void)trainer;
}
