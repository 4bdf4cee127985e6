//! How a module names its parameters: one visitor, written for a struct by the `parameters!`
//! macro from its fields in registration order (PyTorch's order: the order `__init__` assigns
//! them, which is also the optimizer's order and so the order its state is allocated in).

use std::rc::Rc;

use crate::tensor::Tensor;

/// A child's path: `prefix.name`, or `name` at the top.
pub fn child(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") }
}

/// Something with parameters.
pub trait Module {
    /// Calls `visit` with every parameter and its dotted path, in registration order. Written
    /// by `parameters!` for a struct; an enum matches and visits its variant's modules.
    fn visit_parameters(&self, visit: &mut dyn FnMut(String, &Tensor));

    /// Every parameter with its dotted path, in registration order (`named_parameters()`).
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_parameters(&mut |name, p| out.push((name, p.share())));
        out
    }

    fn parameters(&self) -> Vec<Tensor> {
        let mut out = Vec::new();
        self.visit_parameters(&mut |_, p| out.push(p.share()));
        out
    }

    /// The number of parameter elements.
    fn parameter_count(&self) -> u64 {
        let mut count = 0;
        self.visit_parameters(&mut |_, p| count += p.numel() as u64);
        count
    }
}

/// A module's field as its parameters see it: a tensor is one parameter, named after the module
/// and the field; a sub-module (alone, optional, shared or in a list) names its own.
pub trait Field {
    fn visit_field(&self, module: &str, field: &str, visit: &mut dyn FnMut(String, &Tensor));
}

impl Field for Tensor {
    fn visit_field(&self, module: &str, field: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        visit(child(module, field), self);
    }
}

impl<M: Module> Field for M {
    fn visit_field(&self, _: &str, _: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        self.visit_parameters(visit);
    }
}

impl<F: Field> Field for Option<F> {
    fn visit_field(&self, module: &str, field: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        if let Some(f) = self {
            f.visit_field(module, field, visit);
        }
    }
}

impl<F: Field> Field for Rc<F> {
    fn visit_field(&self, module: &str, field: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        F::visit_field(self, module, field, visit);
    }
}

/// A list: its tensors named by index, as `nn.ParameterList` names them (`field.0`, `field.1`);
/// its modules name their own.
impl<F: Field> Field for Vec<F> {
    fn visit_field(&self, module: &str, field: &str, visit: &mut dyn FnMut(String, &Tensor)) {
        for (i, f) in self.iter().enumerate() {
            f.visit_field(module, &format!("{field}.{i}"), visit);
        }
    }
}

/// `impl Module` for a struct from its parameter-holding fields, in registration order:
/// `parameters!(Linear in name { weight, bias })` names its tensors `<self.name>.weight`;
/// `parameters!(Lm { tok_embeddings, blocks, norm, output })` holds only sub-modules, which name
/// their own (a tensor directly in it would be named bare, as at a model's top).
macro_rules! parameters {
    ($ty:ident in $name:ident { $($field:ident),+ $(,)? }) => {
        impl $crate::nn::Module for $ty {
            fn visit_parameters(&self, visit: &mut dyn FnMut(String, &$crate::tensor::Tensor)) {
                $( $crate::nn::Field::visit_field(&self.$field, &self.$name, stringify!($field), visit); )+
            }
        }
    };
    ($ty:ident { $($field:ident),+ $(,)? }) => {
        impl $crate::nn::Module for $ty {
            fn visit_parameters(&self, visit: &mut dyn FnMut(String, &$crate::tensor::Tensor)) {
                $( $crate::nn::Field::visit_field(&self.$field, "", stringify!($field), visit); )+
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, SimOptions};
    use crate::tensor::DType;

    struct Mixture {
        name: String,
        scale: Tensor,
        experts: Vec<Tensor>,
        gate: Option<Tensor>,
    }

    parameters!(Mixture in name { scale, experts, gate });

    #[test]
    fn a_list_of_tensors_is_named_by_index_and_an_absent_one_not_at_all() {
        let dev = Device::sim(SimOptions::preset("H100-80GB"));
        let t = |n| dev.zeros(&[n], DType::F32).unwrap();
        let m = Mixture { name: "moe".into(), scale: t(1), experts: vec![t(2), t(3)], gate: None };
        let named: Vec<(String, usize)> = m.named_parameters().into_iter().map(|(n, p)| (n, p.numel())).collect();
        assert_eq!(named, [("moe.scale".to_string(), 1), ("moe.experts.0".to_string(), 2), ("moe.experts.1".to_string(), 3)]);
        assert_eq!(m.parameter_count(), 6);
    }
}
