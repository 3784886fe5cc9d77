//! The builders' setters that only store their argument, written once.

/// Setters on `$ty` that store their argument: each with its own docs, as
/// `name(arg: Type) => field.path = value;`, returning the builder. A
/// setter without an argument, `name() => field = value;`, is a switch
/// (the stores' hidden negative controls).
macro_rules! setters {
    ($ty:ty { $( $(#[$doc:meta])* $name:ident($($arg:ident: $t:ty)?) => $($field:ident).+ = $value:expr; )* }) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self $(, $arg: $t)?) -> $ty {
                self.$($field).+ = $value;
                self
            }
        )*
    };
}
pub(crate) use setters;
